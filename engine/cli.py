"""The `reconciler` command: `topics create|verify`, `run`, `explain`, `repair`, `demo`.

Bad arguments and bad settings end with one message on stderr and exit status 2; an engine
error (Kafka unreachable, wrong topic layout) ends with its cause and fix and exit status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from engine.errors import ConfigError, EngineError
from engine.settings import Settings, load_settings

_OPERATOR_TIMEOUT_S = 5.0  # engine.admin.brokers.DEFAULT_TIMEOUT_S, without importing Kafka here


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("reconciler")
    except PackageNotFoundError:  # a bare checkout that was never installed
        return "unknown (not installed)"


class _HelpWithDefaults(argparse.HelpFormatter):
    """Shows an option's default when it has one (settings defaults are written in the help)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text:
            return text
        return text + " (default: %(default)s)"


def _setting_default(name: str) -> str:
    default = Settings.model_fields[name].default
    return f"default: {default}, or RECONCILER_{name.upper()}"


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="TOML settings file")
    parser.add_argument(
        "--bootstrap-servers",
        help=f"Kafka bootstrap servers, host:port,... ({_setting_default('bootstrap_servers')})",
    )
    parser.add_argument(
        "--topic-prefix",
        help=f"prefix of every topic name ({_setting_default('topic_prefix')})",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        help=f"partition count of every topic ({_setting_default('partitions')})",
    )


def _add_timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout",
        type=float,
        default=_OPERATOR_TIMEOUT_S,
        metavar="SECONDS",
        help="give up (exit 1) when the brokers do not answer or the topics are missing",
    )


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(
        args.config,
        bootstrap_servers=args.bootstrap_servers,
        topic_prefix=args.topic_prefix,
        partitions=args.partitions,
    )


def _topics_create(args: argparse.Namespace) -> int:
    from engine.admin.topics import create_topics

    settings = _topic_settings(args)
    created = create_topics(settings, force=args.force)
    for name in created:
        print(f"created {name}")
    print(
        f"topics ready: {len(settings.topics.inputs)} inputs co-partitioned with "
        f"{settings.partitions} partitions, changelog compacted"
    )
    return _print_cluster_report(settings)


def _topics_verify(args: argparse.Namespace) -> int:
    from engine.admin.topics import verify_topics

    settings = _topic_settings(args)
    verify_topics(settings)
    print("topics verified")
    return _print_cluster_report(settings)


def _topic_settings(args: argparse.Namespace) -> Settings:
    return load_settings(
        args.config,
        bootstrap_servers=args.bootstrap_servers,
        topic_prefix=args.topic_prefix,
        partitions=args.partitions,
        replication_factor=args.replication_factor,
    )


def _print_cluster_report(settings: Settings) -> int:
    """Replication facts, then each problem on stderr; exit 1 when there is one."""
    from engine.admin.topics import cluster_report

    report = cluster_report(settings)
    print(f"brokers: {report.brokers}")
    for fact in report.facts:
        print(fact)
    shown = ", ".join(report.under_replicated[:10]) or "none"
    print(f"under-replicated partitions: {len(report.under_replicated)} ({shown})")
    for problem in report.problems:
        print(f"reconciler: problem: {problem}", file=sys.stderr)
    return 1 if report.problems else 0


def _run(args: argparse.Namespace) -> int:
    import logging

    from engine.oplog import configure
    from engine.runtime.memory import child_env
    from engine.runtime.supervisor import Backoff, supervise_all

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = _run_settings(args)  # bad settings end here with exit 2, before any child
    configure(settings.log_format)
    if args.child:
        return _run_engine(settings)
    commands = [_child_command(args, settings, n) for n in range(settings.processes)]
    code = supervise_all(
        commands,
        env=child_env(os.environ, settings.malloc_arena_max),
        backoff=Backoff(max_s=settings.restart_backoff_max_s),
    )
    return code if code >= 0 else 128 - code  # killed by a signal: the shell's convention


def _child_command(args: argparse.Namespace, settings: Settings, n: int) -> list[str]:
    """The engine child's command line; with --processes N > 1, child n gets its own instance
    id (its transactional id and static group membership), state folder and metrics port."""
    own: dict[str, object] = {}
    if settings.processes > 1:
        own = {
            "--instance-id": f"{settings.instance_id}-{n}",
            "--state-dir": settings.state_dir / f"process-{n}",
            "--metrics-port": settings.metrics_port + n if settings.metrics_port else 0,
        }
    command = [sys.executable, "-m", "engine.cli", "run", "--child"]
    for flag, value in (
        ("--config", args.config),
        ("--bootstrap-servers", args.bootstrap_servers),
        ("--topic-prefix", args.topic_prefix),
        ("--partitions", args.partitions),
        ("--instance-id", args.instance_id),
        ("--state-dir", args.state_dir),
        ("--metrics-port", args.metrics_port),
        ("--log-format", args.log_format),
        ("--schema-registry-url", args.schema_registry_url),
    ):
        value = own.get(flag, value)
        if value is not None:
            command += [flag, str(value)]
    return command


def _run_settings(args: argparse.Namespace) -> Settings:
    return load_settings(
        args.config,
        bootstrap_servers=args.bootstrap_servers,
        topic_prefix=args.topic_prefix,
        partitions=args.partitions,
        instance_id=args.instance_id,
        state_dir=args.state_dir,
        metrics_port=args.metrics_port,
        log_format=args.log_format,
        schema_registry_url=args.schema_registry_url,
        processes=args.processes,
    )


def _run_engine(settings: Settings) -> int:
    """The supervised child: the engine itself, under its watchdog."""
    import logging

    from engine.admin.isr_watch import IsrWatch
    from engine.admin.topics import verify_topics
    from engine.runtime.collector import Collector
    from engine.runtime.engine import Engine
    from engine.runtime.metrics import EngineMetrics, serve_health
    from engine.runtime.supervisor import parent_gone, restarts_before
    from engine.runtime.watchdog import Watchdog

    logging.getLogger("reconciler").info("settings: %s", settings.redacted())
    watchdog = Watchdog()
    watchdog.start(orphan_check=parent_gone)
    budget_s = settings.transaction_timeout_ms / 1000 + settings.watchdog_margin_s
    with watchdog.guard("verify topics", budget_s):
        verify_topics(settings)
    metrics = EngineMetrics()
    metrics.engine_restarts.inc(restarts_before())
    server = serve_health(metrics, settings.metrics_port) if settings.metrics_port else None
    isr_watch = IsrWatch(settings, metrics).start()
    # The process's own collector policy; an Engine built in a test freezes nothing.
    engine = Engine(settings, metrics=metrics, watchdog=watchdog, collector=Collector())
    engine.install_signal_handlers()
    engine.tune_gc()
    try:
        engine.run()
    finally:
        isr_watch.stop()
        watchdog.stop()
        if server is not None:
            server.shutdown()
    return 0


def _explain(args: argparse.Namespace) -> int:
    from engine.admin.explain import explain

    print(explain(_settings(args), args.session, timeout_s=args.timeout))
    return 0


def _repair(args: argparse.Namespace) -> int:
    from engine.admin.repair import repair
    from engine.core.events import RepairResolution

    decision = repair(
        _settings(args),
        args.session,
        RepairResolution(args.resolution),
        args.reason,
        actor=args.actor,
        intent_id=args.intent_id,
        wait_s=args.wait,
        timeout_s=args.timeout,
    )
    print(f"{decision.verdict} {decision.reason}")
    for entry in decision.trail:
        print(f"  {entry.step}: {entry.detail}")
    return 0 if decision.verdict == "RECORDED" else 1


def _demo(args: argparse.Namespace) -> int:
    from engine.demo import run_demo, run_embedded

    settings = _settings(args)
    print(run_embedded(settings) if args.embedded_engine else run_demo(settings))
    return 0


def _non_empty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reconciler",
        description="Continuation-authority engine for AI-agent runners, on Kafka.",
        formatter_class=_HelpWithDefaults,
    )
    parser.add_argument("--version", action="version", version=f"reconciler {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    topics = commands.add_parser("topics", help="create or verify the engine's topics")
    topic_commands = topics.add_subparsers(dest="topics_command", required=True)
    for name, handler, text in (
        ("create", _topics_create, "create missing topics (idempotent) and verify the layout"),
        ("verify", _topics_verify, "check co-partitioning and the compacted changelog"),
    ):
        sub = topic_commands.add_parser(name, help=text)
        _add_common(sub)
        sub.add_argument(
            "--replication-factor",
            type=int,
            help="of the topics created (default: the cluster's default.replication.factor,"
            " or RECONCILER_REPLICATION_FACTOR)",
        )
        sub.set_defaults(handler=handler)
        if name == "create":
            sub.add_argument(
                "--force",
                action="store_true",
                help="accept replication factor 1 on a cluster of several brokers",
            )
    run = commands.add_parser(
        "run", help="run the engine in the foreground until SIGTERM, restarting it if it dies"
    )
    _add_common(run)
    defaults = Settings.model_fields
    run.add_argument(
        "--instance-id",
        help="stable id of this instance (transactional id; default: "
        f"{defaults['instance_id'].default}, or RECONCILER_INSTANCE_ID)",
    )
    run.add_argument(
        "--state-dir",
        type=Path,
        help="folder of the local state stores (default: "
        f"./{defaults['state_dir'].default}, or RECONCILER_STATE_DIR)",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        help="port of /metrics, /healthz, /readyz (default: "
        f"{defaults['metrics_port'].default}, or RECONCILER_METRICS_PORT; 0: none)",
    )
    run.add_argument(
        "--log-format", choices=["text", "json"], help="json: one JSON object per log line"
    )
    run.add_argument(
        "--schema-registry-url",
        help="Confluent-compatible registry: also accept registry-framed inputs",
    )
    run.add_argument(
        "--processes",
        type=int,
        help="engine processes in the group, one per core (default: 1, or RECONCILER_PROCESSES)",
    )
    # The supervisor starts the engine itself with --child; users never pass it.
    run.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    run.set_defaults(handler=_run)

    explain = commands.add_parser("explain", help="print the decision trail of one session")
    _add_common(explain)
    _add_timeout(explain)
    explain.add_argument("session", type=_non_empty, help="session id")
    explain.set_defaults(handler=_explain)

    repair = commands.add_parser("repair", help="resolve an ambiguous or violated session")
    _add_common(repair)
    repair.add_argument("session", type=_non_empty, help="session id")
    repair.add_argument(
        "--resolution",
        required=True,
        choices=["ACCEPT_COMMITTED", "ACCEPT_ABSENT", "ABANDON"],
        help="what the operator verified in the Session store",
    )
    repair.add_argument("--reason", required=True, type=_non_empty, help="why (kept in the trail)")
    repair.add_argument("--actor", type=_non_empty, help="who (default: the OS user)")
    repair.add_argument("--intent-id", help="the pending write being resolved")
    _add_timeout(repair)
    repair.add_argument(
        "--wait",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long to wait for the engine's answer once the command is recorded",
    )
    repair.set_defaults(handler=_repair)

    demo = commands.add_parser("demo", help="drive scripted runners through the key cases")
    _add_common(demo)
    demo.add_argument(
        "--embedded-engine",
        action="store_true",
        help="create fresh demo topics and run an engine in this process for the demo",
    )
    demo.set_defaults(handler=_demo)
    for sub in (*commands.choices.values(), *topic_commands.choices.values()):
        sub.formatter_class = _HelpWithDefaults
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except ConfigError as exc:
        print(f"reconciler: {exc}", file=sys.stderr)
        return 2
    except EngineError as exc:
        print(f"reconciler: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
