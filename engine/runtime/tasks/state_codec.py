"""How a session's state is written to the changelog and the local store.

The value is the versioned Avro `SessionState` record (`schemas/session_state.v*.avsc`) in
single-object encoding, whatever framing the input topics use: the changelog is internal, so it
never needs a registry, and the fingerprint still lets a newer engine read older states.
"""

from __future__ import annotations

from engine.core.state import SessionState
from engine.wire import Codec, DecodeError, RecordType

_CODEC = Codec()


class StateFormatError(Exception):
    """A changelog value this engine cannot read; the operator must rebuild the partition."""


def encode_state(state: SessionState) -> bytes:
    return _CODEC.encode(state)


def decode_state(data: bytes) -> SessionState:
    try:
        state = _CODEC.decode(RecordType.SESSION_STATE, data)
    except DecodeError as exc:
        raise StateFormatError(
            f"unreadable session state in the changelog or local store ({exc}). Fix: upgrade "
            "the engine to one that knows this schema, or rebuild the partition from its inputs."
        ) from exc
    assert isinstance(state, SessionState)
    return state
