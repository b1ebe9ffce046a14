"""`make bench`: one table from one run against the local broker; prints figures, asserts nothing.

1. throughput, after a warm-up round (not counted), rounds interleaved (pipe, reconciler x1,
   reconciler x2, Quix, each round starting one system later), each system on the same
   pre-produced input (tools/bench_fold.py's mix) in fresh topics: inputs answered per second,
   each input counted once, at its final answer, by the bench client; median and range over
   rounds, and ratios taken within each round. CPU per input of the system, the broker and the
   bench client from /proc between the first and the last answer, and the ceiling those give
   on this machine's cores; CPU ratios too, which the other load on the machine moves less
   than it moves rates;
2. resume-to-decision latency at two resume rates, one process beside the raw EOS pipe under the
   same load, rounds interleaved, the engine's p99 divided by the pipe's in each round
   (tools/bench_latency.py);
3. RSS, restart and restore at 200,000 sessions, a cold restore of 1,000,000, and failover
   when one of three instances is killed (tools/bench_restore.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools import bench_latency, bench_restore
from tools.bench_fold import build_log
from tools.bench_kafka import (
    REPO,
    AnswerCounter,
    CpuSampler,
    Input,
    broker_pid,
    cpu_s,
    encode_inputs,
    fresh_settings,
    produce_inputs,
    start,
    start_engine,
    stop,
    tree_cpu_s,
)

PIPE, ONE, TWO, QUIX = "raw EOS pipe", "reconciler run", "reconciler run --processes 2", "Quix"
SYSTEMS = (PIPE, ONE, TWO, QUIX)
THROUGHPUT_FETCH_WAIT_MS = 100
"""The bench client's idle fetch wait in the throughput runs: it adds at most this much to a
run of seconds (a fetch returns when answers arrive), where 10 ms of idle polling cost the
broker a quarter of a core that the system under test needs."""


@dataclass(frozen=True)
class Run:
    """One system in one round. `rate`: inputs answered per second once answers flow
    (AnswerCounter.rate); `launch_rate`: all inputs / time from the process launch to the last
    final answer (start-up included). CPU per input answered between the first and the last
    answer (start-up, imports and restore left out), in us: `cpu_us` of the system under test
    (every process of it), `broker_us` of the broker JVM, `client_us` of this bench's answer
    counter (its thread and its consumer's threads)."""

    rate: float
    launch_rate: float
    cpu_us: float
    broker_us: float
    client_us: float
    decisions_per_input: float

    @property
    def total_us(self) -> float:
        return self.cpu_us + self.broker_us + self.client_us

    def ceiling(self, cores: int) -> float:
        """Inputs/s if every core did nothing but this run's work (system, broker, client)."""
        return cores * 1e6 / self.total_us if self.total_us else 0.0


def _no_cpu() -> float:
    return 0.0


def run_system(system: str, args: argparse.Namespace, inputs: Sequence[Input]) -> Run | None:
    settings = fresh_settings(args.bootstrap_servers, args.partitions, args.commit_ms)
    produce_inputs(settings, inputs)
    log = Path(tempfile.mkdtemp(prefix="bench-log-")) / "system.log"
    flags = [
        "--bootstrap-servers",
        settings.bootstrap_servers,
        "--topic-prefix",
        settings.topic_prefix,
        "--commit-ms",
        str(args.commit_ms),
    ]
    counter = AnswerCounter(
        settings,
        {i.event_id for i in inputs},
        count_records=system == PIPE,
        fetch_wait_ms=THROUGHPUT_FETCH_WAIT_MS,
    ).start()
    broker = broker_pid(settings.bootstrap_servers)
    broker_cpu = CpuSampler((lambda: cpu_s(broker)) if broker else _no_cpu).start()
    client_cpu = CpuSampler(lambda: cpu_s(os.getpid(), reaped=False)).start()
    launched = time.monotonic()
    if system == PIPE:
        proc = start([sys.executable, "-m", "tools.bench_pipe", *flags], log)
    elif system == QUIX:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        proc = start([args.quix_python, "-m", "tools.bench_quix", *flags], log, env)
    else:
        proc = start_engine(settings, log, processes=2 if system == TWO else 1)
    system_cpu = CpuSampler(lambda: tree_cpu_s(proc.pid)).start()
    answered = counter.wait(args.timeout)
    for sampler in (system_cpu, broker_cpu, client_cpu):
        sampler.stop()
    stop(proc)
    if not answered:
        print(f"  {system}: not every input answered within {args.timeout:.0f} s; see {log}")
        return None
    n = len(inputs)
    steady = max(1, n - counter.first_batch)

    def per_input(sampler: CpuSampler) -> float:
        return (sampler.at(counter.done_at) - sampler.at(counter.first_at)) / steady * 1e6

    return Run(
        rate=counter.rate(),
        launch_rate=n / (counter.done_at - launched),
        cpu_us=per_input(system_cpu),
        broker_us=per_input(broker_cpu),
        client_us=per_input(client_cpu),
        decisions_per_input=counter.decisions / n,
    )


def _spread(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    if not values:
        return "n/a"
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"


def _int(value: float) -> str:
    return f"{value:,.0f}"


def _ratio(value: float) -> str:
    return f"{value:.2f}"


def throughput(args: argparse.Namespace) -> None:
    events = build_log(args.sessions)
    inputs = encode_inputs(events)
    systems = [s for s in SYSTEMS if s != QUIX or Path(args.quix_python).exists()]
    print(
        f"throughput: {len(inputs):,} inputs ({args.sessions:,} sessions, tools/bench_fold.py "
        f"mix), {args.partitions} partitions, commit every {args.commit_ms} ms, exactly-once, "
        f"{args.rounds} rounds interleaved"
    )
    if QUIX not in systems:
        print(f"  (no Quix: {args.quix_python} does not exist; `make bench` creates it)")
    for warm in range(args.warmup):
        # The first runs on a fresh broker are slow (JIT, page cache, topic creation paths):
        # one round of every system first, not counted.
        for system in systems:
            run = run_system(system, args, inputs)
            shown = f"{run.rate:,.0f} inputs/s" if run else "failed"
            print(f"  warm-up {warm + 1}: {system}: {shown} (not counted)", flush=True)
    runs: dict[str, list[Run | None]] = {s: [] for s in systems}
    for round_no in range(args.rounds):
        # Each round starts with the next system: no system always runs first or last after
        # the same neighbour (the broker's compaction and the page cache carry over).
        order = systems[round_no % len(systems) :] + systems[: round_no % len(systems)]
        for system in order:
            run = run_system(system, args, inputs)
            runs[system].append(run)
            shown = (
                f"{run.rate:,.0f} inputs/s, CPU us/input {run.cpu_us:,.0f} + broker "
                f"{run.broker_us:,.0f} + bench client {run.client_us:,.0f}"
                if run
                else "failed"
            )
            print(f"  round {round_no + 1}: {system}: {shown}", flush=True)
    label = {
        PIPE: "raw EOS pipe (no decode/fold)",
        ONE: "reconciler run, 1 process",
        TWO: "reconciler run --processes 2",
        QUIX: "Quix Streams 3.28.1, same fold",
    }
    cores = os.cpu_count() or 1
    print()
    print(
        "| system | inputs/s, median (range) | from launch | CPU us/input: system | broker "
        f"| bench client | ceiling on {cores} cores, inputs/s | decisions/input |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for system in systems:
        done = [r for r in runs[system] if r is not None]
        print(
            f"| {label[system]} | {_spread([r.rate for r in done], _int)} "
            f"| {_spread([r.launch_rate for r in done], _int)} "
            f"| {_spread([r.cpu_us for r in done], _int)} "
            f"| {_spread([r.broker_us for r in done], _int)} "
            f"| {_spread([r.client_us for r in done], _int)} "
            f"| {_spread([r.ceiling(cores) for r in done], _int)} "
            f"| {_spread([r.decisions_per_input for r in done], _ratio)} |"
        )
    for top, bottom in ((ONE, PIPE), (ONE, QUIX), (TWO, ONE), (TWO, QUIX)):
        if top not in runs or bottom not in runs:
            continue
        ratios = [
            a.rate / b.rate
            for a, b in zip(runs[top], runs[bottom], strict=True)
            if a is not None and b is not None
        ]
        print(f"| ratio {label[top]} / {label[bottom]} | {_spread(ratios, _ratio)} | | | | | | |")
        cpu_ratios = [
            b.cpu_us / a.cpu_us
            for a, b in zip(runs[top], runs[bottom], strict=True)
            if a is not None and b is not None and a.cpu_us
        ]
        print(
            f"| CPU ratio {label[bottom]} / {label[top]} (us/input) "
            f"| {_spread(cpu_ratios, _ratio)} | | | | | | |"
        )
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--sessions", type=int, default=20_000, help="for the throughput runs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="uncounted rounds first")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--commit-ms", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=600, help="per run, seconds")
    parser.add_argument("--quix-python", default=str(REPO / ".venv-quix" / "bin" / "python"))
    parser.add_argument("--rates", default="200,1000", help="resumes/s for the latency runs")
    parser.add_argument("--seconds", type=int, default=15, help="per latency run")
    parser.add_argument("--live-sessions", type=int, default=200_000)
    parser.add_argument("--restore-sessions", type=int, default=1_000_000)
    parser.add_argument("--failover-seconds", type=float, default=25, help="load after the kill")
    parser.add_argument("--failover-runs", type=int, default=1, help="kills, each in a fresh group")
    parser.add_argument("--failover-session-ms", type=int, help="session.timeout.ms there")
    parser.add_argument("--only", choices=["throughput", "latency", "restore", "failover"])
    args = parser.parse_args()
    if args.only in (None, "throughput"):
        throughput(args)
    if args.only in (None, "latency"):
        bench_latency.report(args)
    if args.only in (None, "restore"):
        bench_restore.report(args)
    if args.only == "failover":
        bench_restore.report(args, failover_only=True)


if __name__ == "__main__":
    main()
