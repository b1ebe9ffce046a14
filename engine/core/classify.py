"""The SDK's three-way classification of a pending write, on digests only.

``committed`` iff ``observed == before + batch``; ``unchanged`` iff the last ``len(before)``
observed digests equal ``before`` (or nothing was observed when ``before == []``). Exactly one
true decides; both or neither is ambiguous. With ``append_acknowledged`` only ``committed`` is
accepted. For chunked backends (``chunk_size``, OpenAI Conversations: 20) a batch longer than a
chunk is also checked for a chunk-prefix commit, exactly as the SDK 0.24.0 does for
Conversations; any such prefix is a partial commit.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.core.events import Classification
from engine.core.members import (
    CLS_AMBIGUOUS_BOTH,
    CLS_CHANGED,
    CLS_COMMITTED,
    CLS_NOT_STARTED,
    CLS_PARTIAL,
    CLS_UNCHANGED,
)


def is_committed(observed: Sequence[str], before: Sequence[str], batch: Sequence[str]) -> bool:
    return list(observed) == [*before, *batch]


def is_unchanged(observed: Sequence[str], before: Sequence[str]) -> bool:
    if not before:
        return len(observed) == 0
    return list(observed[-len(before) :]) == list(before)


def chunk_partial(
    observed: Sequence[str], before: Sequence[str], batch: Sequence[str], chunk_size: int
) -> bool:
    """True when a whole-chunk prefix of the batch (but not all of it) sits after ``before``."""
    n, count = len(batch), len(before)
    complete_before = count < n + 1  # the snapshot held the entire history
    for k in range(chunk_size, n, chunk_size):
        window = [*before, *batch[:k]]
        length_ok = (not complete_before) or len(observed) == count + k
        if length_ok and list(observed[-(count + k) :]) == window:
            return True
    return False


def prefix_landed(observed: Sequence[str], before: Sequence[str], batch: Sequence[str]) -> bool:
    """True when the observed window ends with ``before + batch[:k]`` for some 0 < k < N.

    Used only to name a (F, F) outcome PARTIAL in the trail and to remember it: it never turns a
    verdict the SDK would reach into another one.
    """
    count = len(before)
    for k in range(len(batch) - 1, 0, -1):
        window = [*before, *batch[:k]]
        if list(observed[-(count + k) :]) == window and len(observed) >= count + k:
            return True
    return False


def classify(
    *,
    observed: Sequence[str],
    before: Sequence[str] | None,
    batch: Sequence[str],
    append_acknowledged: bool = False,
    chunk_size: int | None = None,
) -> Classification:
    """Classify an observed tail against a pending write, as SDK 0.24.0 does, plus PARTIAL."""
    if before is None and not append_acknowledged:
        return CLS_NOT_STARTED
    before_list = list(before or [])
    committed = is_committed(observed, before_list, batch)
    if append_acknowledged:
        return CLS_COMMITTED if committed else CLS_CHANGED
    unchanged = is_unchanged(observed, before_list)
    if chunk_size is not None and len(batch) > chunk_size:
        if len(before_list) < len(batch) + 1:
            unchanged = unchanged and len(observed) == len(before_list)
        if chunk_partial(observed, before_list, batch, chunk_size):
            return CLS_PARTIAL
    if committed and unchanged:
        return CLS_AMBIGUOUS_BOTH
    if committed:
        return CLS_COMMITTED
    if unchanged:
        return CLS_UNCHANGED
    if prefix_landed(observed, before_list, batch):
        return CLS_PARTIAL
    return CLS_CHANGED
