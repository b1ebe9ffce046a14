"""Every memory bound is a setting and reaches the client or store it bounds (README,
"Memory"); the chart's memory request and limit leave room for their sum."""

from __future__ import annotations

import gc
import time
import tracemalloc
from pathlib import Path

from engine.core.fold import fold
from engine.core.state import SessionState
from engine.runtime.clients import consumer_config, producer_config
from engine.runtime.process.memory import ARENA_ENV, Trimmer, child_env
from engine.runtime.tasks.read_cache import DECODED_BYTES_PER_ENCODED
from engine.runtime.tasks.state_codec import decode_state, encode_state
from engine.runtime.tasks.store import LocalStore
from engine.settings import load_settings
from tests.helm_render import engine_env, one, render
from tests.integration.exactly_once import workload

BASE_MB = 90
"""The interpreter, librdkafka and the code at rest (tools/mem_profile.py: 54 MB at start, a
little more once the clients' threads and buffers are up)."""


def test_librdkafka_queues_are_bounded_by_the_settings() -> None:
    settings = load_settings(environ={}, fetch_queue_mb=8, producer_queue_mb=24)
    consumer = consumer_config(settings)
    assert consumer["queued.max.messages.kbytes"] == 8 * 1024
    assert consumer["fetch.max.bytes"] == 4 * 2**20
    assert producer_config(settings)["queue.buffering.max.kbytes"] == 24 * 1024


def test_the_defaults_are_far_below_librdkafkas() -> None:
    settings = load_settings(environ={})
    assert consumer_config(settings)["queued.max.messages.kbytes"] == 16 * 1024  # not 64 MB
    assert producer_config(settings)["queue.buffering.max.kbytes"] == 32 * 1024  # not 1 GB


def test_the_producer_lingers_as_configured() -> None:
    assert producer_config(load_settings(environ={}))["linger.ms"] == 50
    settings = load_settings(environ={"RECONCILER_PRODUCER_LINGER_MS": "5"})
    assert producer_config(settings)["linger.ms"] == 5


def test_the_sqlite_page_cache_is_bounded(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "p0.sqlite", cache_kib=512)
    assert store._db.execute("PRAGMA cache_size").fetchone()[0] == -512
    store.close()


def test_the_engine_child_gets_malloc_arena_max_unless_the_operator_set_it() -> None:
    assert child_env({"PATH": "/bin"}, 2) == {"PATH": "/bin", ARENA_ENV: "2"}
    assert child_env({ARENA_ENV: "4"}, 2) == {ARENA_ENV: "4"}
    assert ARENA_ENV not in child_env({}, 0), "0 leaves glibc's default"


def test_trims_at_most_once_per_interval() -> None:
    trimmer = Trimmer(interval_s=10.0)
    start = time.monotonic()
    assert not trimmer.maybe_trim(start + 1.0)
    assert trimmer.maybe_trim(start + 11.0)
    assert not trimmer.maybe_trim(start + 12.0)
    assert trimmer.maybe_trim(start + 21.5)
    assert trimmer.trims == 2
    assert not Trimmer(interval_s=0).maybe_trim(start + 1e6), "0 disables it"


def _mib(quantity: str) -> int:
    number, unit = int(quantity[:-2]), quantity[-2:]
    return number * {"Mi": 1, "Gi": 1024}[unit]


def test_the_charts_memory_request_and_limit_cover_the_configured_bounds() -> None:
    manifests = render()
    settings = load_settings(None, engine_env(manifests))
    assert settings.malloc_arena_max == 2
    pod = one(manifests, "StatefulSet")["spec"]["template"]["spec"]
    (engine,) = (c for c in pod["containers"] if c["name"] == "engine")
    bounds = (
        BASE_MB
        + 2 * settings.read_cache_mb
        + settings.fetch_queue_mb
        + settings.producer_queue_mb
        + settings.store_cache_mb
    )
    assert _mib(engine["resources"]["requests"]["memory"]) >= bounds
    assert _mib(engine["resources"]["limits"]["memory"]) >= bounds * 3 // 2


def test_the_read_caches_size_estimate_matches_decoded_states() -> None:
    """The read cache weighs a state by its encoded size x DECODED_BYTES_PER_ENCODED: an
    estimate far below the truth would let the cache outgrow read_cache_mb."""
    states: dict[str, SessionState] = {}
    for offset, event in enumerate(workload(500, seed=53)):
        states[event.session_id] = fold(states.get(event.session_id), event, offset).state
    encoded = [encode_state(state) for state in states.values()]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        decoded = [decode_state(data) for data in encoded]
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    held = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    ratio = held / sum(len(data) for data in encoded)
    assert len(decoded) == len(encoded)
    assert ratio <= DECODED_BYTES_PER_ENCODED, f"decoded states take {ratio:.1f}x their bytes"
    assert ratio >= DECODED_BYTES_PER_ENCODED / 2, f"the estimate wastes the cache ({ratio:.1f}x)"
