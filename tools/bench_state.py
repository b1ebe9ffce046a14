"""Bytes of an idle session's state, field by field, and on disk in the local store.

Run from the repository root: ``.venv/bin/python -m tools.bench_state [--sessions 200000]``.
Not a test, and no broker: it prints, for the idle session of `make bench` (one REGISTER intent
of tools/bench_fold.py's mix), the Avro bytes of every field in each supported session_state
version, then the SQLite store's size per session with N such sessions written through
`LocalStore.apply` (the table and its index from SQLite's dbstat, and the file after the WAL is
checkpointed, as the bench measures the state directory of a stopped engine).

``--codec-rounds N`` instead times the generated state writer and reader of each version on
the states tools/bench_fold.py commits (its mix of 2,000 sessions), rounds interleaved v2, v3,
v2, ..., and prints the median µs per state and the v3/v2 ratio of each round's pair (both
versions as the generated Python text; the engine runs the current one compiled by `make`).

``--msgpack-rounds N`` times, on the same states, the engine's state codec (`Codec.encode` and
`Codec.decode` of the current session_state version, header included, as step 3 and a restore
call them) beside msgspec's MessagePack encoder and typed decoder of the same `SessionState`
values, rounds interleaved, and prints the median µs per state, the msgpack/Avro ratio of each
round's pair and the bytes. A measurement of a possible private format only: the persisted
state stays Avro (a rolling upgrade needs both releases to read each other's state).
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
from msgspec.structs import replace

from engine.core.fold import fold
from engine.core.state import SessionState
from engine.runtime.tasks.store import LocalStore, StoreWrite
from engine.wire import POLICY, SHIPPED_SCHEMAS, Codec, RecordType
from engine.wire.avro_gen import reader_for, writer_for
from engine.wire.codec import fields_of
from engine.wire.limits import DEFAULT_LIMITS
from engine.wire.raw_digests import convert, has_raw_digests, hex_to_raw
from engine.wire.values import to_record
from tools.bench_fold import build_log, fold_all
from tools.bench_kafka import register_intent

STATE = RecordType.SESSION_STATE
CODEC = Codec()
BATCH = 5_000


def idle_state(n: int) -> SessionState:
    """Session n of the bench mix after its REGISTER intent (what `make bench` keeps live)."""
    return fold(None, register_intent(n), n).state


def _long_size(n: int) -> int:
    n = (n << 1) ^ (n >> 63)
    size = 1
    while n > 0x7F:
        n >>= 7
        size += 1
    return size


def avro_size(avro: Any, value: Any, named: dict[str, Any]) -> int:
    """The Avro binary size of ``value`` under ``avro`` (a parsed schema), without writing it."""
    if isinstance(avro, str) and avro in named:
        avro = named[avro]
    if isinstance(avro, list):
        index = 0 if value is None else next(i for i, b in enumerate(avro) if b != "null")
        return 1 + (0 if value is None else avro_size(avro[index], value, named))
    kind = avro if isinstance(avro, str) else avro["type"]
    if kind in ("string", "bytes"):
        data = value.encode() if isinstance(value, str) else value
        return _long_size(len(data)) + len(data)
    if kind in ("long", "int"):
        return _long_size(value)
    if kind == "boolean":
        return 1
    if kind == "enum":
        return _long_size(avro["symbols"].index(value))
    if kind == "array":
        items = sum(avro_size(avro["items"], item, named) for item in value)
        return (_long_size(len(value)) + items + 1) if value else 1
    if kind == "record":
        named.setdefault(avro["name"], avro)
        return sum(avro_size(f["type"], value[f["name"]], named) for f in avro["fields"])
    raise ValueError(f"no size rule for {avro!r}")


def field_sizes(state: SessionState, version: int) -> dict[str, int]:
    """Bytes of every top-level field (the slot split into its own fields), header included."""
    schema = SHIPPED_SCHEMAS.get(STATE, version)
    record = fields_of(schema, to_record(state))
    if has_raw_digests(schema.source):
        record = convert(schema.source, record, hex_to_raw)
    named: dict[str, Any] = {}
    sizes = {"single-object header": 10}
    for field in schema.parsed["fields"]:
        avro, value = field["type"], record[field["name"]]
        if field["name"] == "slot" and value is not None:
            slot_schema = next(b for b in avro if b != "null")
            sizes["slot (union branch)"] = 1
            named.setdefault(slot_schema["name"], slot_schema)
            for sub in slot_schema["fields"]:
                sizes[f"slot.{sub['name']}"] = avro_size(sub["type"], value[sub["name"]], named)
        else:
            sizes[field["name"]] = avro_size(avro, value, named)
    total = sum(sizes.values())
    assert total == len(CODEC.encode(state, version=version)), "the size walk is off"
    return sizes


def disk_per_session(sessions: int, version: int) -> tuple[float, dict[str, float]]:
    """File bytes per session of one store holding ``sessions`` idle states, and the share of
    each b-tree (table, indexes) from dbstat."""
    folder = Path(tempfile.mkdtemp(prefix="bench-state-"))
    path = folder / "p0.sqlite"
    store = LocalStore(path)
    template = idle_state(0)
    for start in range(0, sessions, BATCH):
        writes = []
        for n in range(start, min(start + BATCH, sessions)):
            state = replace(template, session_id=f"conv-{n:06d}")
            data = CODEC.encode(state, version=version)
            writes.append(StoreWrite(session_id=state.session_id, state=data))
        store.apply(writes, changelog_offset=start)
    store.close()  # the last connection checkpoints the WAL into the file
    size = sum(f.stat().st_size for f in folder.iterdir())
    db = sqlite3.connect(path)
    parts = {
        str(name): float(pages) / sessions
        for name, pages in db.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name")
    }
    db.close()
    for file in folder.iterdir():
        file.unlink()
    folder.rmdir()
    return size / sessions, parts


def codec_rounds(rounds: int) -> None:
    """Generated writer and reader of v2 and v3 on the same states, interleaved."""
    _, commits = fold_all(build_log(2_000), 500)
    states = [state for commit in commits for state in commit]
    paths = {}
    for version in (2, 3):
        schema = SHIPPED_SCHEMAS.get(STATE, version).parsed
        # Not the build's compiled copy: `make` compiles the current version only, and the
        # comparison is of the two formats under the same generated code.
        write = writer_for(schema, SessionState, built=False)
        read = reader_for(schema, SessionState, DEFAULT_LIMITS, built=False)
        bodies = [write(state) for state in states]
        assert [read(body) for body in bodies] == states
        paths[version] = (write, read, bodies)
    timings: dict[tuple[int, str], list[float]] = {}
    for _ in range(rounds):
        for version, (write, read, bodies) in paths.items():
            start = time.perf_counter()
            for state in states:
                write(state)
            middle = time.perf_counter()
            for body in bodies:
                read(body)
            end = time.perf_counter()
            timings.setdefault((version, "encode"), []).append((middle - start) / len(states))
            timings.setdefault((version, "decode"), []).append((end - middle) / len(states))
    mean_bytes = {v: sum(map(len, paths[v][2])) / len(states) for v in paths}
    print(f"{len(states):,} committed states of the bench_fold mix, {rounds} rounds interleaved:")
    print("| stage | v2 µs/state | v3 µs/state | v3/v2 (median of paired rounds) |")
    print("|---|---|---|---|")
    for stage in ("encode", "decode"):
        v2, v3 = timings[(2, stage)], timings[(3, stage)]
        ratio = statistics.median(b / a for a, b in zip(v2, v3, strict=True))
        print(
            f"| {stage} | {statistics.median(v2) * 1e6:.2f} | {statistics.median(v3) * 1e6:.2f} "
            f"| {ratio:.2f} |"
        )
    print(f"| body bytes (mean) | {mean_bytes[2]:.0f} | {mean_bytes[3]:.0f} | |")


def msgpack_rounds(rounds: int) -> None:
    """The engine's Avro state codec and msgspec's MessagePack on the same states, interleaved."""
    _, commits = fold_all(build_log(2_000), 500)
    states = [state for commit in commits for state in commit]
    encoder, decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(SessionState)
    avro = [CODEC.encode(state) for state in states]
    packed = [encoder.encode(state) for state in states]
    assert [CODEC.decode(STATE, data) for data in avro] == states
    assert [decoder.decode(data) for data in packed] == states
    paths: dict[str, tuple[Any, Any, list[bytes]]] = {
        "avro": (CODEC.encode, lambda data: CODEC.decode(STATE, data), avro),
        "msgpack": (encoder.encode, decoder.decode, packed),
    }
    timings: dict[tuple[str, str], list[float]] = {}
    clock = time.process_time
    for _ in range(rounds):
        for name, (write, read, blobs) in paths.items():
            start = clock()
            for state in states:
                write(state)
            middle = clock()
            for blob in blobs:
                read(blob)
            end = clock()
            timings.setdefault((name, "encode"), []).append((middle - start) / len(states))
            timings.setdefault((name, "decode"), []).append((end - middle) / len(states))
    print(f"{len(states):,} committed states of the bench_fold mix, {rounds} rounds interleaved:")
    print("| stage | Avro µs/state | msgpack µs/state | msgpack/Avro (median of paired rounds) |")
    print("|---|---|---|---|")
    for stage in ("encode", "decode"):
        a, m = timings[("avro", stage)], timings[("msgpack", stage)]
        ratio = statistics.median(y / x for x, y in zip(a, m, strict=True))
        print(
            f"| {stage} | {statistics.median(a) * 1e6:.2f} | {statistics.median(m) * 1e6:.2f} "
            f"| {ratio:.2f} |"
        )
    mean = {name: sum(map(len, blobs)) / len(states) for name, (_, _, blobs) in paths.items()}
    print(f"| bytes (mean) | {mean['avro']:.0f} | {mean['msgpack']:.0f} | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=200_000)
    parser.add_argument("--codec-rounds", type=int, default=0)
    parser.add_argument("--msgpack-rounds", type=int, default=0)
    args = parser.parse_args()
    if args.msgpack_rounds:
        msgpack_rounds(args.msgpack_rounds)
        return
    if args.codec_rounds:
        codec_rounds(args.codec_rounds)
        return
    versions = sorted(v for v in POLICY[STATE].supported if v >= 2)
    state = idle_state(123_456)
    per_version = {v: field_sizes(state, v) for v in versions}
    print(f"idle session state (session {state.session_id}), Avro bytes per field:")
    print("| field | " + " | ".join(f"v{v}" for v in versions) + " |")
    print("|---|" + "---|" * len(versions))
    for name in per_version[versions[-1]]:
        row = " | ".join(str(per_version[v].get(name, "-")) for v in versions)
        print(f"| {name} | {row} |")
    totals = " | ".join(f"**{sum(per_version[v].values())}**" for v in versions)
    print(f"| total | {totals} |")
    print()
    print(f"local store (SQLite, {args.sessions:,} idle sessions), bytes per session:")
    print("| version | Avro value | file | b-trees (dbstat) |")
    print("|---|---|---|---|")
    for version in versions:
        value = len(CODEC.encode(state, version=version))
        size, parts = disk_per_session(args.sessions, version)
        split = ", ".join(f"{name} {share:.0f}" for name, share in sorted(parts.items()))
        print(f"| v{version} | {value} | {size:.0f} | {split} |")


if __name__ == "__main__":
    main()
