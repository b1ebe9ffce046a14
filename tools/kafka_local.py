"""Run a real, single-node Apache Kafka 4.x broker (KRaft, broker+controller) for development.

    python tools/kafka_local.py start  [--instance NAME] [--fresh]
    python tools/kafka_local.py stop   [--instance NAME]
    python tools/kafka_local.py restart [--instance NAME]   # same ports, same data
    python tools/kafka_local.py status [--instance NAME]
    python tools/kafka_local.py bootstrap [--instance NAME]   # prints host:port of a running broker
    python tools/kafka_local.py logs   [--instance NAME] [--lines N]

    python tools/kafka_local.py start --secure [--instance NAME]   # SASL/SCRAM + ACLs
    python tools/kafka_local.py start --in-memory [--instance NAME]   # data in RAM (make bench)
    python tools/kafka_local.py credentials [--instance NAME]   # principals of a secure broker

    python tools/kafka_local.py start --nodes 3 [--instance NAME]   # three brokers behind a
        # fault proxy (tools/kafka_cluster.py, which also has the per-node commands); `stop`,
        # `status` and `bootstrap` of such an instance go to the cluster

The broker's jars come from Maven Central (the dependency declaration is `tools/kafka/pom.xml`)
into the per-version cache outside the clone (`~/.cache/reconciler/kafka-<version>/libs`, see
tools/cache.py), only when missing, so every clone on the machine shares them. Each instance
lives in the clone's `.kafka/<instance>/`: its `server.properties`, KRaft data, `broker.log`, and
`broker.json` (pid and ports) which is how a second `start` finds the first one instead of
starting a duplicate.

`--secure` (tools/kafka_secure.py) replaces the plaintext client listener with SASL/SCRAM-SHA-512
and turns on StandardAuthorizer ACLs for three principals: `admin` (super user, creates topics),
`engine` and `runner`, whose rights are those the README's "Security" section lists.

`--in-memory` keeps the broker's data (`.kafka/<instance>/data`, then a link) in a folder of
the machine's RAM-backed `/dev/shm`, always fresh, removed again by `stop`. `make bench` runs
its broker so: on a disk that the broker shares with everything else on a small machine, its
writes back and syncs stalled every system under test for 0.4-1 s at a time a few minutes into
a run, which decided the latency tail of whichever system was running then
(docs/performance-history.md has the measurement).

Ports are free ones picked at start, or taken from `RECONCILER_KAFKA_PORT` and
`RECONCILER_KAFKA_CONTROLLER_PORT`.

Every failure ends with one line naming the cause and the fix, and exit status 2.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

try:
    from tools import kafka_secure
    from tools.cache import cache_root
except ModuleNotFoundError:  # run as `python tools/kafka_local.py`: tools/ itself is on sys.path
    import kafka_secure  # type: ignore[import-not-found,no-redef]
    from cache import cache_root  # type: ignore[import-not-found,no-redef]

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".kafka"
POM = REPO / "tools" / "kafka" / "pom.xml"
KAFKA_VERSION = "4.1.1"
LIBS = cache_root() / f"kafka-{KAFKA_VERSION}" / "libs"
MEMORY_ROOT = Path("/dev/shm")
MEMORY_MIN_FREE_BYTES = 4 << 30  # twice the 1-2 GiB make bench's runs write, as estimated
START_TIMEOUT_S = float(os.environ.get("RECONCILER_KAFKA_START_TIMEOUT", "90"))
STOP_TIMEOUT_S = 30.0

# Settings for one node on loopback: replication factor 1 everywhere, no auto-created topics,
# and group/transaction timers shortened so failure tests detect a dead member in seconds.
SINGLE_NODE_SETTINGS = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "inter.broker.listener.name": "PLAINTEXT",
    "controller.listener.names": "CONTROLLER",
    "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
    "num.partitions": "1",
    "auto.create.topics.enable": "false",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "min.insync.replicas": "1",
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",
    "group.consumer.min.session.timeout.ms": "3000",
    "group.consumer.session.timeout.ms": "6000",
    "group.consumer.min.heartbeat.interval.ms": "500",
    "group.consumer.heartbeat.interval.ms": "1000",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    "transaction.remove.expired.transaction.cleanup.interval.ms": "10000",
    "log.cleaner.backoff.ms": "1000",
}

LOG4J2 = """\
status = warn
appender.out.type = File
appender.out.name = OUT
appender.out.fileName = {log}
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.ak.name = org.apache.kafka
logger.ak.level = INFO
"""


class SetupError(Exception):
    """A failure the user can fix; the message names the cause and the fix."""


@dataclass
class BrokerInfo:
    pid: int
    port: int
    controller_port: int
    kafka_version: str
    secure: bool = False

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


def instance_dir(instance: str) -> Path:
    return CACHE / instance


def info_path(instance: str) -> Path:
    return instance_dir(instance) / "broker.json"


def memory_dir(instance: str) -> Path:
    """Where an `--in-memory` instance of this clone keeps its data."""
    clone = hashlib.sha256(str(instance_dir(instance)).encode()).hexdigest()[:12]
    return MEMORY_ROOT / f"reconciler-kafka-{instance}-{clone}"


def drop_memory_data(instance: str) -> None:
    """Free the RAM of an `--in-memory` instance's data (nothing for one on disk)."""
    data = instance_dir(instance) / "data"
    if data.is_symlink():
        shutil.rmtree(data.resolve(), ignore_errors=True)
        data.unlink()


def put_data_in_memory(instance: str) -> None:
    """Link the instance's data folder (not there yet) to a fresh folder in `MEMORY_ROOT`."""
    if not MEMORY_ROOT.is_dir():
        raise SetupError(
            f"--in-memory needs {MEMORY_ROOT} (a RAM-backed file system). "
            "Fix: start without --in-memory (for `make bench`: BENCH_BROKER=)."
        )
    free = shutil.disk_usage(MEMORY_ROOT).free
    if free < MEMORY_MIN_FREE_BYTES:
        raise SetupError(
            f"--in-memory needs {MEMORY_MIN_FREE_BYTES >> 30} GiB free in {MEMORY_ROOT}, which "
            f"has {free / (1 << 30):.1f} GiB. Fix: free it, or start without --in-memory (for "
            "`make bench`: BENCH_BROKER=)."
        )
    target = memory_dir(instance)
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    (instance_dir(instance) / "data").symlink_to(target, target_is_directory=True)


def log_path(instance: str) -> Path:
    return instance_dir(instance) / "broker.log"


JAVA_FIX = "install a Java 17+ runtime (apt-get install openjdk-17-jre-headless)."


def require_tool(name: str, fix: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise SetupError(f"`{name}` was not found on PATH. Fix: {fix}")
    return found


def ensure_jars() -> None:
    """Resolve the broker's jars with Maven, only when the cache is missing or incomplete."""
    marker = LIBS / f".complete-{KAFKA_VERSION}"
    if marker.exists():
        return
    mvn = require_tool("mvn", "install Apache Maven 3.8+ (apt-get install maven).")
    require_tool("java", JAVA_FIX)
    if LIBS.exists():
        shutil.rmtree(LIBS)
    print(f"kafka_local: fetching Apache Kafka {KAFKA_VERSION} jars with Maven into {LIBS} ...")
    started = time.monotonic()
    proc = subprocess.run(
        [
            mvn,
            "-q",
            "-B",
            "-f",
            str(POM),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={LIBS}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not any(LIBS.glob(f"kafka_2.13-{KAFKA_VERSION}.jar")):
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise SetupError(
            f"Maven could not download the Kafka jars (exit {proc.returncode}).\n{tail}\n"
            "Fix: check that Maven Central is reachable (mvn settings, proxy), then run again."
        )
    marker.touch()
    print(f"kafka_local: jars ready in {time.monotonic() - started:.1f}s")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_from_env(var: str) -> int | None:
    raw = os.environ.get(var)
    if not raw:
        return None
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise SetupError(f"{var}={raw!r} is not a TCP port. Fix: set it to 1-65535 or unset it.")
    port = int(raw)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise SetupError(
                f"port {port} from {var} is in use ({exc.strerror}). "
                f"Fix: stop what listens there, or unset {var} to pick a free port."
            ) from exc
    return port


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child still answers kill(0); it is not a running broker
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return True


def is_our_broker(pid: int, instance: str) -> bool:
    """True if `pid` runs Kafka with this instance's server.properties (what `start` ran)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    config = str(instance_dir(instance) / "server.properties").encode()
    return config in args and b"kafka.Kafka" in args


def read_info(instance: str) -> BrokerInfo | None:
    path = info_path(instance)
    if not path.exists():
        return None
    info = BrokerInfo(**json.loads(path.read_text()))
    return info if pid_alive(info.pid) else None


def answers_metadata(
    bootstrap: str, timeout_s: float, config: dict[str, str] | None = None
) -> bool:
    """True once the broker serves a metadata request (not just an open port)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, **(config or {})})
    try:
        admin.list_topics(timeout=timeout_s)
    except Exception:
        return False
    return True


def write_configs(instance: str, port: int, controller_port: int, secure: bool = False) -> Path:
    home = instance_dir(instance)
    settings = dict(SINGLE_NODE_SETTINGS)
    settings.update(
        {
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            "log.dirs": str(home / "data"),
        }
    )
    if secure:
        settings.update(kafka_secure.broker_settings(home, port, controller_port))
    props = home / "server.properties"
    props.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
    (home / "log4j2.properties").write_text(LOG4J2.format(log=log_path(instance)))
    return props


def java_command(instance: str, main: str, *args: str, heap: str = "256m") -> list[str]:
    home = instance_dir(instance)
    return [
        require_tool("java", JAVA_FIX),
        f"-Xms{heap}",
        f"-Xmx{heap}",
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={home / 'log4j2.properties'}",
        f"-Dkafka.logs.dir={home}",
        "-cp",
        f"{LIBS}/*",
        main,
        *args,
    ]


def cluster_id_of(raw: bytes) -> str | None:
    """Kafka's text form of a 16-byte id; None when it starts with "-", which kafka-storage's
    argument parser reads as an option (1 start in 64 failed so; Kafka's own Uuid redraws too)."""
    text = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    return None if text.startswith("-") else text


def new_cluster_id(draw: Callable[[], bytes] = lambda: uuid.uuid4().bytes) -> str:
    while (cluster_id := cluster_id_of(draw())) is None:
        pass
    return cluster_id


def format_storage(instance: str, props: Path, secure: bool = False) -> None:
    cluster_id = new_cluster_id()
    # SCRAM credentials must exist before the first SASL login: they go into the metadata log
    # at format time (KRaft has no ZooKeeper to write them to beforehand).
    scram = kafka_secure.format_args(instance_dir(instance)) if secure else []
    fmt = subprocess.run(
        java_command(
            instance,
            "kafka.tools.StorageTool",
            "format",
            "--standalone",
            "-t",
            cluster_id,
            "-c",
            str(props),
            *scram,
        ),
        capture_output=True,
        text=True,
        check=False,
    )
    if fmt.returncode != 0:
        raise SetupError(
            f"formatting KRaft storage failed: {(fmt.stdout + fmt.stderr).strip()[-800:]}\n"
            f"Fix: run `python tools/kafka_local.py start --fresh --instance {instance}`."
        )


def start(
    instance: str,
    fresh: bool,
    port: int | None = None,
    controller_port: int | None = None,
    secure: bool = False,
    in_memory: bool = False,
) -> BrokerInfo:
    """`in_memory`: the data in RAM, always fresh (the module docstring)."""
    running = read_info(instance)
    if running is not None:
        print(
            f"kafka_local: broker '{instance}' already running (pid {running.pid}) "
            f"at {running.bootstrap}; not starting another"
        )
        return running
    ensure_jars()
    home = instance_dir(instance)
    if (fresh or in_memory) and home.exists():
        drop_memory_data(instance)
        shutil.rmtree(home)
    if home.exists() and kafka_secure.is_secure(home) != secure:
        raise SetupError(
            f"instance '{instance}' was made {'with' if not secure else 'without'} --secure. "
            f"Fix: add --fresh to start it {'secure' if secure else 'plain'} (wipes its data)."
        )
    home.mkdir(parents=True, exist_ok=True)
    if in_memory:
        put_data_in_memory(instance)
    port = port or port_from_env("RECONCILER_KAFKA_PORT") or free_port()
    controller_port = (
        controller_port or port_from_env("RECONCILER_KAFKA_CONTROLLER_PORT") or free_port()
    )
    if secure:
        kafka_secure.ensure_credentials(home)
    props = write_configs(instance, port, controller_port, secure)

    if not (home / "data" / "meta.properties").exists():  # formatted once per data dir
        format_storage(instance, props, secure)

    started = time.monotonic()
    with open(home / "broker.out", "ab") as out:
        proc = subprocess.Popen(
            java_command(instance, "kafka.Kafka", str(props), heap="768m"),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # outlives this script; `stop` ends it
        )
    info = BrokerInfo(
        pid=proc.pid,
        port=port,
        controller_port=controller_port,
        kafka_version=KAFKA_VERSION,
        secure=secure,
    )
    info_path(instance).write_text(json.dumps(asdict(info)))
    admin_config = kafka_secure.client_config(home, "admin") if secure else {}
    while not answers_metadata(info.bootstrap, timeout_s=1.0, config=admin_config):
        if proc.poll() is not None:
            info_path(instance).unlink(missing_ok=True)
            raise SetupError(
                f"the broker exited with status {proc.returncode} while starting.\n"
                f"{tail(instance, 25)}\nFix: read {log_path(instance)}; a port clash or a "
                f"stale data dir (`start --fresh`) are the usual causes."
            )
        if time.monotonic() - started > START_TIMEOUT_S:
            stop(instance)
            raise SetupError(
                f"the broker did not answer a metadata request within {START_TIMEOUT_S:.0f}s.\n"
                f"{tail(instance, 25)}\nFix: check memory/CPU load, or raise "
                "RECONCILER_KAFKA_START_TIMEOUT."
            )
        time.sleep(0.25)
    if secure:
        kafka_secure.create_acls(home, info.bootstrap)
    print(
        f"kafka_local: Apache Kafka {KAFKA_VERSION} '{instance}' up at {info.bootstrap} "
        f"(pid {info.pid}) in {time.monotonic() - started:.1f}s"
    )
    return info


def stop(instance: str, keep_data: bool = False) -> None:
    """Stop the broker; an `--in-memory` instance's data goes too unless `keep_data`."""
    path = info_path(instance)
    if not path.exists():
        if not keep_data:
            drop_memory_data(instance)  # a broker that died leaves its RAM taken
        print(f"kafka_local: broker '{instance}' is not running")
        return
    info = BrokerInfo(**json.loads(path.read_text()))
    if pid_alive(info.pid) and not is_our_broker(info.pid, instance):
        # After a reboot the recorded pid can belong to an unrelated process: never signal it.
        print(
            f"kafka_local: pid {info.pid} is not the broker of '{instance}' (its command line "
            f"does not name {instance_dir(instance) / 'server.properties'}); not signalling it, "
            "removing the stale broker.json"
        )
        path.unlink(missing_ok=True)
        return
    if pid_alive(info.pid):
        os.killpg(info.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while pid_alive(info.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if pid_alive(info.pid):
            print(
                f"kafka_local: broker pid {info.pid} ignored SIGTERM for "
                f"{STOP_TIMEOUT_S:.0f}s; killing it"
            )
            os.killpg(info.pid, signal.SIGKILL)
    path.unlink(missing_ok=True)
    if not keep_data:
        drop_memory_data(instance)
    print(f"kafka_local: broker '{instance}' stopped")


def restart(instance: str) -> BrokerInfo:
    """Stop a running broker and start it again on the same ports with the same data."""
    info = read_info(instance)
    if info is None:
        raise SetupError(f"broker '{instance}' is not running. Fix: start it first.")
    stop(instance, keep_data=True)
    return start(
        instance,
        fresh=False,
        port=info.port,
        controller_port=info.controller_port,
        secure=info.secure,
    )


def tail(instance: str, lines: int) -> str:
    texts = []
    for path in (log_path(instance), instance_dir(instance) / "broker.out"):
        if path.exists():
            body = path.read_text(errors="replace").splitlines()[-lines:]
            texts.append(f"--- last {len(body)} lines of {path} ---\n" + "\n".join(body))
    return "\n".join(texts) or f"(no broker log in {instance_dir(instance)})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kafka_local", description=__doc__.splitlines()[0])
    parser.add_argument(
        "command",
        choices=["start", "stop", "restart", "status", "bootstrap", "logs", "credentials"],
    )
    parser.add_argument("--instance", default="dev", help="name of the broker (default: dev)")
    parser.add_argument("--fresh", action="store_true", help="wipe the instance's data first")
    parser.add_argument("--lines", type=int, default=60, help="log lines for `logs`")
    parser.add_argument(
        "--secure", action="store_true", help="SASL/SCRAM-SHA-512 listener with ACLs"
    )
    parser.add_argument(
        "--in-memory", action="store_true", help="the data in /dev/shm, fresh, gone at stop"
    )
    parser.add_argument("--nodes", type=int, default=1, help="brokers (3: a cluster)")
    args = parser.parse_args(argv)
    try:  # imported here: tools/kafka_cluster.py builds on this module
        from tools import kafka_cluster
    except ModuleNotFoundError:
        import kafka_cluster  # type: ignore[import-not-found,no-redef]
    if args.nodes > 1 or kafka_cluster.is_cluster(args.instance):
        return kafka_cluster.main(argv if argv is not None else sys.argv[1:])
    try:
        if args.command == "start":
            start(args.instance, args.fresh, secure=args.secure, in_memory=args.in_memory)
        elif args.command == "credentials":
            print(json.dumps(kafka_secure.read_credentials(instance_dir(args.instance))))
        elif args.command == "stop":
            stop(args.instance)
        elif args.command == "restart":
            restart(args.instance)
        elif args.command == "logs":
            print(tail(args.instance, args.lines))
        else:
            info = read_info(args.instance)
            if info is None:
                print(f"kafka_local: broker '{args.instance}' is not running", file=sys.stderr)
                return 1
            if args.command == "bootstrap":
                print(info.bootstrap)
            else:
                print(json.dumps({**asdict(info), "bootstrap": info.bootstrap}))
    except SetupError as exc:
        print(f"kafka_local: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
