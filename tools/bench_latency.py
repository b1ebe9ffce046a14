"""Resume-to-decision latency under a steady load, for `make bench`.

At R resumes/s plus R intents/s (each resume on a new session, each intent registering another
new session), end to end is the time from a resume's produce (its event time, wall clock) to its
decision read back read_committed by the bench client. Per stage, p50/p99 come from the
engine's `reconciler_stage_seconds{stage=...}` histogram (scraped from /metrics before and after
the run, quantiles from the difference as Prometheus' histogram_quantile computes them), or
"n/a" while the engine does not export it.

Without `--system`, the engine runs beside the raw EOS pipe (tools/bench_pipe.py, committing
when drained, as the engine commits) under the same load, `--rounds` rounds interleaved, and
the engine's p50/p99 are divided by the pipe's of the same round: the floor that consume ->
produce -> commit at the same commit interval gives on this machine. `--system pipe` runs the
pipe alone.
`--trace` has the engine write a line per input at each loop step
(engine/runtime/process/trace.py) and prints where the time of the slowest 1% went
(tools/latency_trace.py). `--paired --variant
off:RECONCILER_COMMIT_OVERLAP=0 --variant on:RECONCILER_COMMIT_OVERLAP=1` runs the engine once per
variant (its settings from the environment) in each round, beside the pipe.

`python -m tools.bench_latency --bootstrap-servers B --rates 1000 --seconds 10 --trace`
"""

from __future__ import annotations

import argparse
import re
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import defaultdict
from pathlib import Path
from subprocess import STDOUT, Popen

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from msgspec.structs import replace

from engine.core.events import ResumeEvent
from engine.settings import Settings
from engine.wire import RecordType
from engine.wire.errors import DecodeError
from tools.bench_fold import BINDING
from tools.bench_kafka import (
    CODEC,
    AnswerCounter,
    encode_inputs,
    engine_env,
    fresh_settings,
    produce_inputs,
    register_intent,
    start,
    stop,
)
from tools.latency_trace import Breakdown, Traced, summarize, traced

ENGINE, PIPE, PIPE_DRAINED = "engine", "pipe", "pipe-drained"
BASELINE = "baseline:"  # + the path of another checkout: its engine, for A/B runs
VARIANT = "engine:"  # + a label: this engine with some settings of its own (`--variant`)

STAGES = ("consume_wait", "fold", "produce", "commit", "persist", "fold_ahead", "commit_wait")
_BUCKET = re.compile(r"^reconciler_stage_seconds_bucket\{(?P<labels>[^}]*)\}\s+(?P<n>\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')

Buckets = dict[str, dict[float, float]]  # stage -> upper bound -> cumulative count


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def scrape_stages(port: int) -> Buckets:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return {}
    found: Buckets = defaultdict(dict)
    for line in text.splitlines():
        match = _BUCKET.match(line)
        if match:
            labels = dict(_LABEL.findall(match["labels"]))
            found[labels.get("stage", "?")][float(labels["le"])] = float(match["n"])
    return dict(found)


def quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float | None:
    """histogram_quantile over the increase between two scrapes (linear within a bucket)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    rank, lower, below = q * counts[-1], 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if bound == float("inf"):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, count
    return lower


def wait_ready(port: int, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"bench: the engine on port {port} was not ready within {timeout_s:.0f} s")


def wait_leaders(settings: Settings, timeout_s: float = 60) -> None:
    """Until every decisions partition has a leader (fresh topics: the warm-up reads from
    their ends). The engine's readiness implies it; the pipe has no readiness probe."""
    consumer = Consumer(settings.client_config(**{"group.id": f"lat-{uuid.uuid4().hex[:8]}"}))
    deadline = time.monotonic() + timeout_s
    try:
        for p in range(settings.partitions):
            while True:
                try:
                    consumer.get_watermark_offsets(TopicPartition(settings.topics.decisions, p), 5)
                    break
                except KafkaException:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
    finally:
        consumer.close()


def warm_up(settings: Settings, pipe: bool, timeout_s: float = 120) -> None:
    """Until resumes on every partition get answers: ready is not yet a settled group."""
    probes = [
        ResumeEvent(
            event_id=f"warm-{n}",
            session_id=f"warm-{n}",
            event_time_ms=int(time.time() * 1000),
            runner_id="r",
            checkpoint_id="c",
            binding=BINDING,
        )
        for n in range(8 * settings.partitions)
    ]
    ids = {p.event_id for p in probes}
    counter = AnswerCounter(settings, ids, count_records=pipe, from_end=True).start()
    produce_inputs(settings, encode_inputs(probes))
    if not counter.wait(timeout_s):
        raise SystemExit(f"bench: warm-up resumes unanswered after {timeout_s:.0f} s")


def _read_latencies(
    settings: Settings, pipe: bool, stop: threading.Event, into: dict[str, tuple[float, float]]
) -> None:
    """Session -> (read at, resume's event time), wall clock ms, for every final answer read
    (the pipe answers with the resume's own bytes)."""
    consumer = Consumer(
        settings.client_config(
            **{
                "group.id": f"lat-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 5,
            }
        )
    )
    topic = settings.topics.decisions  # assign(): no group join delays the first reads
    consumer.assign([TopicPartition(topic, p, 0) for p in range(settings.partitions)])
    while not stop.is_set():
        # consume(n, timeout) waits until n records or the timeout: wait for the first only
        batch = consumer.consume(1, timeout=0.05)
        if batch:
            batch += consumer.consume(999, timeout=0)
        for message in batch:
            if message.error() is None:
                now_ms = time.time() * 1000
                value = message.value() or b""
                if pipe:
                    try:
                        resume = CODEC.decode_record(RecordType.RESUME, value)
                    except DecodeError:  # the pipe answers the intents too
                        continue
                    if str(resume["session_id"]).startswith("lat-"):  # not a warm-up probe
                        into[str(resume["session_id"])] = (now_ms, resume["event_time_ms"])
                    continue
                decision = CODEC.decode_record(RecordType.DECISION, value)
                if str(decision["in_reply_to"]).startswith("lat-") and decision["final"]:
                    into[str(decision["in_reply_to"])] = (now_ms, decision["event_time_ms"])
    consumer.close()


Stages = dict[str, tuple[float | None, float | None]]


def stamp_at_broker(settings: Settings) -> None:
    """Input records carry the broker's append time as their timestamp (the trace's
    `created`), so produce -> broker and broker -> engine are told apart; the event time in
    the payload is still the producer's clock."""
    admin = AdminClient(settings.client_config())
    resources = [
        ConfigResource(
            ResourceType.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry(
                    "message.timestamp.type",
                    "LogAppendTime",
                    incremental_operation=AlterConfigOpType.SET,
                )
            ],
        )
        for topic in settings.topics.inputs
    ]
    for future in admin.incremental_alter_configs(resources).values():
        future.result(30)


def _start(
    settings: Settings, system: str, folder: Path, trace: bool, extra: dict[str, str]
) -> Popen[bytes]:
    log = folder / "system.log"
    if system in (PIPE, PIPE_DRAINED):
        flags = ["--bootstrap-servers", settings.bootstrap_servers]
        flags += ["--topic-prefix", settings.topic_prefix]
        flags += ["--commit-ms", str(settings.commit_interval_ms)]
        flags += ["--commit-drained"] if system == PIPE_DRAINED else []
        return start([sys.executable, "-m", "tools.bench_pipe", *flags], log)
    env = engine_env(settings) | extra
    if trace:
        env["RECONCILER_LATENCY_TRACE_PATH"] = str(folder / "trace.csv")
    if system.startswith(BASELINE):  # another checkout's engine, same interpreter and venv
        return Popen(
            [sys.executable, "-m", "engine.cli", "run"],
            env=env,
            cwd=system.removeprefix(BASELINE),
            stdout=log.open("ab"),
            stderr=STDOUT,
            start_new_session=True,
        )
    return start([sys.executable, "-m", "engine.cli", "run"], log, env)


def run_latency(
    bootstrap: str,
    partitions: int,
    commit_ms: int,
    rate: int,
    seconds: int,
    system: str = ENGINE,
    trace: bool = False,
    extra: dict[str, str] | None = None,
) -> tuple[list[float], Stages, list[Traced]]:
    """End-to-end samples (ms), per stage (p50, p99) in ms, and with `trace` each resume's
    segments (tools/latency_trace.py); `extra`: environment for the engine (settings)."""
    port = free_port()
    settings = fresh_settings(bootstrap, partitions, commit_ms, metrics_port=port)
    folder = Path(tempfile.mkdtemp(prefix="bench-log-"))
    if trace:
        stamp_at_broker(settings)
    proc = _start(settings, system, folder, trace, extra or {})
    answers: dict[str, tuple[float, float]] = {}
    stopping = threading.Event()
    pipe = system in (PIPE, PIPE_DRAINED)
    reader = threading.Thread(target=_read_latencies, args=(settings, pipe, stopping, answers))
    before: Buckets = {}
    after: Buckets = {}
    try:
        if pipe:
            wait_leaders(settings)
        else:
            wait_ready(port)
        warm_up(settings, pipe)
        reader.start()
        producer = Producer(
            settings.client_config(**{"partitioner": "murmur2_random", "linger.ms": 1})
        )
        before = scrape_stages(port)
        interval, next_at = 1.0 / rate, time.monotonic()
        for n in range(rate * seconds):
            sid = f"lat-{n}"
            now_ms = int(time.time() * 1000)
            resume = ResumeEvent(
                event_id=sid,
                session_id=sid,
                event_time_ms=now_ms,
                runner_id="r",
                checkpoint_id="c",
                binding=BINDING,
            )
            producer.produce(settings.topics.resumes, key=sid.encode(), value=CODEC.encode(resume))
            # An intent on another session, as background load, stamped now as a runner would:
            # with the mix's own times (1970) the order buffer ranks every intent before every
            # resume, and on a backlog resumes wait until the intents run out (seconds).
            load = replace(register_intent(n), event_time_ms=now_ms)
            producer.produce(
                settings.topics.intents, key=load.session_id.encode(), value=CODEC.encode(load)
            )
            producer.poll(0)
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
        producer.flush(30)
        time.sleep(3)  # the last answers
        after = scrape_stages(port)
    finally:
        stopping.set()
        if reader.is_alive():
            reader.join()
        stop(proc)
    latencies = [read_at - event_time for read_at, event_time in answers.values()]
    found = traced(folder / "trace.csv", answers) if trace else []
    stages = {
        stage: (
            _ms(quantile(0.5, before.get(stage, {}), after[stage])),
            _ms(quantile(0.99, before.get(stage, {}), after[stage])),
        )
        for stage in STAGES
        if stage in after
    }
    return latencies, stages, found


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _show(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def report(args: argparse.Namespace) -> None:
    """`make bench`'s latency section: the engine (1 process) beside the raw EOS pipe
    committing when drained (as the engine commits), rounds interleaved, each round starting
    with the next system, after one unreported warm-up run of each (a fresh broker answers the
    first seconds of load several times slower). Per run p50/p99 end to end, the engine's
    stages, and its p50/p99 ÷ the pipe's in the same round; then per rate the medians and the
    ratios of every round. `--system pipe|pipe-drained` runs that system alone."""
    system, trace = getattr(args, "system", ENGINE), getattr(args, "trace", False)
    rates = [int(r) for r in args.rates.split(",")]
    rounds = max(1, getattr(args, "rounds", 1))
    systems = [PIPE_DRAINED, ENGINE] if system == ENGINE else [system]
    name = {ENGINE: "engine", PIPE: "pipe", PIPE_DRAINED: "pipe"}
    beside = " beside the raw EOS pipe (committing when drained, as the engine does)"
    print(
        f"latency: resume -> final decision, end to end (bench client) and per engine stage, "
        f"{'1 process' + beside if system == ENGINE else f'the raw EOS pipe ({system})'}, "
        f"{args.partitions} partitions, commit every {args.commit_ms} ms, {args.seconds} s per "
        f"run, {rounds} round(s) interleaved after one unreported warm-up run each"
    )
    for warm in systems:
        run_latency(args.bootstrap_servers, args.partitions, args.commit_ms, max(rates), 5, warm)
    print(
        "| round | resumes/s + intents/s | system | answered | end to end p50 / p99 ms "
        "| ÷ pipe p50 / p99 | " + " | ".join(f"{s} p50 / p99 ms" for s in STAGES) + " |"
    )
    print("|---" * (6 + len(STAGES)) + "|")
    got: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    ratios: dict[int, list[tuple[float, float]]] = defaultdict(list)
    found: list[tuple[int, Breakdown]] = []
    for n in range(rounds):
        order = systems[n % len(systems) :] + systems[: n % len(systems)]
        for rate in rates:
            row: dict[str, tuple[str, Stages]] = {}
            runs: dict[str, tuple[float, float]] = {}
            for one in order:
                samples, stages, where = run_latency(
                    args.bootstrap_servers,
                    args.partitions,
                    args.commit_ms,
                    rate,
                    args.seconds,
                    one,
                    trace and one == ENGINE,
                )
                summary = summarize(where)
                if summary is not None:
                    found.append((rate, summary))
                p50, p99 = percentile(samples, 0.5), percentile(samples, 0.99)
                if p50 is not None and p99 is not None:
                    runs[one] = (p50, p99)
                    got[(rate, one)].append((p50, p99))
                row[one] = (
                    f"{len(samples):,} / {rate * args.seconds:,} | {_show(p50)} / {_show(p99)}",
                    stages,
                )
            pipe = runs.get(PIPE_DRAINED)
            if pipe is not None and ENGINE in runs:
                ratios[rate].append((runs[ENGINE][0] / pipe[0], runs[ENGINE][1] / pipe[1]))
            for one in systems:  # the pipe's row above the engine's, whichever ran first
                text, stages = row[one]
                ratio = (
                    f"{runs[ENGINE][0] / pipe[0]:.2f} / {runs[ENGINE][1] / pipe[1]:.2f}"
                    if one == ENGINE and pipe is not None and ENGINE in runs
                    else "-"
                )
                cells = [
                    f"{_show(stages[s][0])} / {_show(stages[s][1])}" if s in stages else "-"
                    for s in STAGES
                ]
                print(
                    f"| {n + 1} | {rate} + {rate} | {name[one]} | {text} | {ratio} | "
                    + " | ".join(cells)
                    + " |",
                    flush=True,
                )
    print()
    if system == ENGINE:
        print(
            "| resumes/s + intents/s | engine p50 / p99 ms, median (range) | pipe p50 / p99 ms, "
            "median (range) | engine ÷ pipe p99, per round | engine ÷ pipe p50, per round |"
        )
        print("|---|---|---|---|---|")
        for rate in rates:
            cells = [_spread_pair(got[(rate, one)]) for one in (ENGINE, PIPE_DRAINED)]
            for k in (1, 0):
                cells.append(", ".join(f"{r[k]:.2f}" for r in ratios[rate]) or "-")
            print(f"| {rate} + {rate} | " + " | ".join(cells) + " |")
        print()
    for rate, summary in found:
        print(f"where the time went at {rate} + {rate}/s (tools/latency_trace.py):")
        print(summary.table())


def _spread_pair(runs: list[tuple[float, float]]) -> str:
    """Median (range) of the p50s, then of the p99s, over rounds."""
    if not runs:
        return "n/a"
    parts = []
    for k in (0, 1):
        xs = sorted(r[k] for r in runs)
        mid = statistics.median(xs)
        parts.append(f"{mid:.1f} ({xs[0]:.1f}-{xs[-1]:.1f})" if len(xs) > 1 else f"{mid:.1f}")
    return " / ".join(parts)


def percentile(samples: list[float], q: float) -> float | None:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else None


def paired(args: argparse.Namespace) -> None:
    """The engine against the raw pipe (committing when drained) in the same session, rounds
    interleaved and each round starting with the next system: on a shared machine only a
    ratio measured side by side means anything. `--baseline DIR` adds the engine of another
    checkout (main) as a third system. Per run p50 and p99 and their ratio to the pipe's run
    beside it; at the end, per rate and system, the median and range of those ratios and the
    p50/p99 of the samples pooled over all rounds (one run's p99 rests on 1% of its samples,
    and one stall of the shared machine moves it)."""
    rates = [int(r) for r in args.rates.split(",")]
    variants = dict(_variant(v) for v in args.variant or [])
    systems = [PIPE_DRAINED] + ([VARIANT + v for v in variants] if variants else [ENGINE])
    if args.baseline:
        systems.append(BASELINE + str(Path(args.baseline).resolve()))
    name = {s: ("baseline" if s.startswith(BASELINE) else s) for s in systems}
    extra = {VARIANT + label: env for label, env in variants.items()}
    rows: dict[tuple[int, str], list[Traced]] = defaultdict(list)
    print(
        f"latency, paired: {', '.join(name[s] for s in systems)} (1 process each), "
        f"{args.partitions} partitions, commit every {args.commit_ms} ms, {args.seconds} s per "
        f"run, {args.rounds} rounds interleaved after one unreported warm-up run each"
    )
    print("| round | rate | system | answered | p50 ms | p99 ms |")
    print("|---|---|---|---|---|---|")
    pooled: dict[tuple[int, str], list[float]] = defaultdict(list)
    ratios: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    # A fresh broker's JVM answers the first seconds of load several times slower (seconds
    # from produce to append measured with --trace): one unreported run of each warms it.
    for system in systems:
        run_latency(
            args.bootstrap_servers,
            args.partitions,
            args.commit_ms,
            max(rates),
            5,
            system,
            extra=extra.get(system),
        )
    for n in range(args.first_round - 1, args.first_round - 1 + args.rounds):
        for rate in rates:
            order = systems[n % len(systems) :] + systems[: n % len(systems)]
            got: dict[str, tuple[float, float]] = {}
            for system in order:
                samples, _, found = run_latency(
                    args.bootstrap_servers,
                    args.partitions,
                    args.commit_ms,
                    rate,
                    args.seconds,
                    system,
                    args.trace and not system.startswith((PIPE, BASELINE)),
                    extra.get(system),
                )
                pooled[(rate, system)] += samples
                rows[(rate, system)] += found
                if args.samples:  # for pooling runs of several invocations
                    label = name[system].replace(":", "-")
                    out = Path(args.samples) / f"r{n + 1}-{rate}-{label}.txt"
                    out.write_text("".join(f"{x:.1f}\n" for x in samples))
                p50, p99 = percentile(samples, 0.5), percentile(samples, 0.99)
                if p50 is not None and p99 is not None:
                    got[system] = (p50, p99)
                print(
                    f"| {n + 1} | {rate} | {name[system]} | "
                    f"{len(samples):,} / {rate * args.seconds:,} | {_show(p50)} | {_show(p99)} |",
                    flush=True,
                )
            for system in systems[1:]:
                if system in got and PIPE_DRAINED in got:
                    (s50, s99), (p50_, p99_) = got[system], got[PIPE_DRAINED]
                    ratios[(rate, system)].append((s50 / p50_, s99 / p99_))
    print()
    print(
        "| rate | system | p50 / p99 ms, pooled | ÷ pipe p50, median (range) "
        "| ÷ pipe p99, median (range) |"
    )
    print("|---|---|---|---|---|")
    for rate in rates:
        for system in systems:
            xs = pooled[(rate, system)]
            cells = [f"{_show(percentile(xs, 0.5))} / {_show(percentile(xs, 0.99))}"]
            for k in (0, 1):
                rs = sorted(r[k] for r in ratios[(rate, system)])
                cells.append(
                    f"{statistics.median(rs):.2f} ({rs[0]:.2f}-{rs[-1]:.2f})" if rs else "-"
                )
            print(f"| {rate} + {rate} | {name[system]} | " + " | ".join(cells) + " |")
    for (rate, system), found in rows.items():
        summary = summarize(found)
        if summary is not None:
            print(f"\nwhere the time went, {name[system]} at {rate} + {rate}/s, runs pooled:")
            print(summary.table())


def _variant(text: str) -> tuple[str, dict[str, str]]:
    """`label:NAME=value,NAME=value` -> label and environment."""
    label, _, pairs = text.partition(":")
    env = dict(pair.split("=", 1) for pair in pairs.split(",") if pair)
    if not label or not env:
        raise SystemExit(f"bench: --variant {text!r}: expected label:NAME=value[,NAME=value]")
    return label, env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--commit-ms", type=int, default=100)
    parser.add_argument("--rates", default="200,1000", help="resumes/s")
    parser.add_argument("--seconds", type=int, default=15, help="per rate")
    parser.add_argument("--system", choices=[ENGINE, PIPE, PIPE_DRAINED], default=ENGINE)
    parser.add_argument("--trace", action="store_true", help="per-input breakdown (engine)")
    parser.add_argument(
        "--paired", action="store_true", help="the engine against the pipe, rounds interleaved"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds interleaved")
    parser.add_argument(
        "--first-round",
        type=int,
        default=1,
        help="with --paired: number the rounds from here (which system starts them rotates on)",
    )
    parser.add_argument("--baseline", help="with --paired: another checkout's engine too (A/B)")
    parser.add_argument("--samples", help="with --paired: a folder, each run's latencies into it")
    parser.add_argument(
        "--variant",
        action="append",
        help="with --paired, repeatable: label:NAME=value,... an engine run with that environment",
    )
    args = parser.parse_args()
    if args.paired:
        paired(args)
    else:
        report(args)


if __name__ == "__main__":
    main()
