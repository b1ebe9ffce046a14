"""The loop's generation-0 threshold (engine/runtime/process/memory.py), restored after each
test: it is process-wide."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from engine.runtime.process.memory import tune_gc


@pytest.fixture(autouse=True)
def _restore_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.set_threshold(*threshold)


def test_a_threshold_sets_generation_0_only_and_0_leaves_python_s_own() -> None:
    gc.set_threshold(700, 10, 10)
    tune_gc(0)
    assert gc.get_threshold() == (700, 10, 10)
    tune_gc(50_000)
    assert gc.get_threshold() == (50_000, 10, 10)
