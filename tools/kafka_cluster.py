"""A local three-broker Apache Kafka cluster (KRaft) behind a TCP fault proxy, for fault tests.

    python tools/kafka_local.py start --nodes 3 [--instance NAME] [--fresh]
    python tools/kafka_cluster.py start   [--instance NAME] [--nodes 3] [--fresh]
    python tools/kafka_cluster.py stop    [--instance NAME]
    python tools/kafka_cluster.py status | bootstrap | direct-bootstrap [--instance NAME]
    python tools/kafka_cluster.py kill    --node N   # kill -9 the broker
    python tools/kafka_cluster.py stop    --node N   # SIGTERM: controlled shutdown
    python tools/kafka_cluster.py start   --node N   # start it again, same ports and data
    python tools/kafka_cluster.py restart --node N   # stop + start, then wait for the ISR
    python tools/kafka_cluster.py logs    [--node N] [--lines N]

Shape: three brokers (node ids 1-3) and one dedicated KRaft controller (node id 9), not three
combined broker+controller nodes. The faults under test are broker faults; with combined nodes,
two brokers down would also take the controller quorum below its majority, so nothing could
shrink the ISR or move a leader and the test would see "no controller" instead of "ISR below
min.insync.replicas". With a separate controller a killed broker is fenced after
`broker.session.timeout.ms`, its leaderships move and its replicas leave the ISR exactly as on a
production cluster. The cost is a fourth, small JVM; the controller itself is not a fault target.

Settings: replication factor 3 and `min.insync.replicas=2` for every topic (project topics get
RF 3 from `reconciler topics create --replication-factor 3`, or from `default.replication.factor`),
the internal ones included (`transaction.state.log.replication.factor=3`,
`transaction.state.log.min.isr=2`). The consumer offsets and transaction state topics have one
partition each, so one broker is "the" group coordinator and one "the" transaction coordinator,
which a test can name and kill. Timers are shortened as for the single broker
(tools/kafka_local.py), and a dead broker is fenced after 6 s (Kafka's default is 9 s).

Listeners: each broker has INTERNAL (inter-broker; advertised as itself) and CLIENT (advertised
as its port on the fault proxy, tools/toxiproxy.py). `bootstrap` (proxy ports) is what the
engine uses: every one of its connections goes through the proxy. `direct_bootstrap` (INTERNAL)
is for a test's own load generator and checker, which faults must not touch. Loopback only.

Jars: the same cache as the single broker. State: `.kafka/<instance>/cluster.json` (pids and
ports, which `stop` checks against each process's command line before signalling it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

try:
    from tools import kafka_local as local
    from tools import toxiproxy
except ModuleNotFoundError:  # run as `python tools/kafka_cluster.py`
    import kafka_local as local  # type: ignore[import-not-found,no-redef]
    import toxiproxy  # type: ignore[import-not-found,no-redef]

CONTROLLER_ID = 9
BROKER_HEAP = "384m"
CONTROLLER_HEAP = "192m"
READY_TIMEOUT_S = float(os.environ.get("RECONCILER_KAFKA_START_TIMEOUT", "120"))
ISR_TIMEOUT_S = 90.0

COMMON_SETTINGS = {
    "controller.listener.names": "CONTROLLER",
    "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT,CLIENT:PLAINTEXT",
    # Read by the controller: a broker silent this long is fenced and its leaderships move.
    "broker.session.timeout.ms": "6000",
    # In KRaft the controller creates topics: a request without a replication factor gets
    # the controller's default, so both kinds of node carry these.
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    # A restarted broker gets its preferred leaderships back within seconds (Kafka checks every
    # 300 s), so every round of a fault test starts from the same, balanced leadership.
    "leader.imbalance.check.interval.seconds": "5",
}
BROKER_SETTINGS = {
    **{
        key: value
        for key, value in local.SINGLE_NODE_SETTINGS.items()
        if not key.endswith(("replication.factor", "min.isr", "min.insync.replicas"))
        and key not in ("process.roles", "node.id", "inter.broker.listener.name")
        and key not in COMMON_SETTINGS
    },
    "process.roles": "broker",
    "inter.broker.listener.name": "INTERNAL",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    "broker.heartbeat.interval.ms": "1000",
    "replica.lag.time.max.ms": "10000",
    "num.network.threads": "2",
    "num.io.threads": "4",
}


@dataclass
class Node:
    node_id: int
    internal_port: int
    client_port: int
    proxy_port: int
    pid: int = 0


@dataclass
class ClusterInfo:
    instance: str
    cluster_id: str
    controller_port: int
    proxy_api_port: int
    controller_pid: int = 0
    proxy_pid: int = 0
    nodes: list[Node] = field(default_factory=list)
    kafka_version: str = local.KAFKA_VERSION

    @property
    def bootstrap(self) -> str:
        """Through the fault proxy: what the engine under test uses."""
        return ",".join(f"127.0.0.1:{n.proxy_port}" for n in self.nodes)

    @property
    def direct_bootstrap(self) -> str:
        """Straight to the brokers: for a test's load and checks, untouched by faults."""
        return ",".join(f"127.0.0.1:{n.internal_port}" for n in self.nodes)

    def node(self, node_id: int) -> Node:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        ids = ", ".join(str(n.node_id) for n in self.nodes)
        raise local.SetupError(f"no node {node_id} in '{self.instance}'. Fix: use one of {ids}.")


def home(instance: str) -> Path:
    return local.instance_dir(instance)


def info_path(instance: str) -> Path:
    return home(instance) / "cluster.json"


def node_instance(instance: str, node_id: int) -> str:
    """The kafka_local instance path of one node: its folder under the cluster's folder."""
    return f"{instance}/node-{node_id}" if node_id != CONTROLLER_ID else f"{instance}/controller"


def is_cluster(instance: str) -> bool:
    return info_path(instance).exists()


def read_info(instance: str) -> ClusterInfo | None:
    path = info_path(instance)
    if not path.exists():
        return None
    raw: dict[str, Any] = json.loads(path.read_text())
    raw["nodes"] = [Node(**node) for node in raw["nodes"]]
    return ClusterInfo(**raw)


def write_info(info: ClusterInfo) -> None:
    info_path(info.instance).write_text(json.dumps(asdict(info)))


def _write_props(instance: str, node_id: int, settings: dict[str, str]) -> Path:
    name = node_instance(instance, node_id)
    folder = local.instance_dir(name)
    folder.mkdir(parents=True, exist_ok=True)
    settings = {**settings, "node.id": str(node_id), "log.dirs": str(folder / "data")}
    props = folder / "server.properties"
    props.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
    (folder / "log4j2.properties").write_text(local.LOG4J2.format(log=local.log_path(name)))
    return props


def _controller_props(info: ClusterInfo) -> Path:
    address = f"127.0.0.1:{info.controller_port}"
    return _write_props(
        info.instance,
        CONTROLLER_ID,
        {
            **COMMON_SETTINGS,
            "process.roles": "controller",
            "controller.quorum.bootstrap.servers": address,
            "listeners": f"CONTROLLER://{address}",
            "advertised.listeners": f"CONTROLLER://{address}",
        },
    )


def _broker_props(info: ClusterInfo, node: Node) -> Path:
    return _write_props(
        info.instance,
        node.node_id,
        {
            **COMMON_SETTINGS,
            **BROKER_SETTINGS,
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{info.controller_port}",
            "listeners": f"INTERNAL://127.0.0.1:{node.internal_port},"
            f"CLIENT://127.0.0.1:{node.client_port}",
            "advertised.listeners": f"INTERNAL://127.0.0.1:{node.internal_port},"
            f"CLIENT://127.0.0.1:{node.proxy_port}",
        },
    )


def _format(instance: str, node_id: int, props: Path, cluster_id: str) -> None:
    name = node_instance(instance, node_id)
    if (local.instance_dir(name) / "data" / "meta.properties").exists():
        return
    extra = ["--standalone"] if node_id == CONTROLLER_ID else []
    fmt = subprocess.run(
        local.java_command(
            name, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props), *extra
        ),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if fmt.returncode != 0:
        raise local.SetupError(
            f"formatting KRaft storage of {name} failed: {(fmt.stdout + fmt.stderr)[-600:]}\n"
            f"Fix: run `python tools/kafka_cluster.py start --fresh --instance {instance}`."
        )


def _spawn(instance: str, node_id: int, heap: str) -> int:
    name = node_instance(instance, node_id)
    folder = local.instance_dir(name)
    with open(folder / "broker.out", "ab") as out:
        proc = subprocess.Popen(
            local.java_command(name, "kafka.Kafka", str(folder / "server.properties"), heap=heap),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return proc.pid


def _alive(instance: str, node_id: int, pid: int) -> bool:
    return (
        pid > 0
        and local.pid_alive(pid)
        and local.is_our_broker(pid, node_instance(instance, node_id))
    )


def _signal(instance: str, node_id: int, pid: int, sig: signal.Signals) -> None:
    """Signal a node's process group, only if its command line is that node's (pid check)."""
    if _alive(instance, node_id, pid):
        os.killpg(pid, sig)


def _wait_gone(instance: str, node_id: int, pid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _alive(instance, node_id, pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(instance, node_id, pid):
        print(f"kafka_cluster: node {node_id} ignored SIGTERM for {timeout_s:.0f}s; killing it")
        _signal(instance, node_id, pid, signal.SIGKILL)
        while local.pid_alive(pid):
            time.sleep(0.05)


def _admin(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})


class Cluster:
    """A running cluster: its addresses, node control, leadership queries and the fault proxy."""

    def __init__(self, info: ClusterInfo) -> None:
        self.info = info
        self.faults = toxiproxy.FaultProxy(info.proxy_api_port)

    @property
    def instance(self) -> str:
        return self.info.instance

    @property
    def bootstrap(self) -> str:
        return self.info.bootstrap

    @property
    def direct_bootstrap(self) -> str:
        return self.info.direct_bootstrap

    @property
    def node_ids(self) -> list[int]:
        return [node.node_id for node in self.info.nodes]

    def is_up(self, node_id: int) -> bool:
        return _alive(self.instance, node_id, self.info.node(node_id).pid)

    def kill(self, node_id: int) -> None:
        """kill -9 one broker (no controlled shutdown: leaders move after the fencing timeout).
        Its proxy port closes too: a client then gets "connection refused" as from a dead
        broker's host, not a connection the proxy accepts and drops."""
        node = self.info.node(node_id)
        _signal(self.instance, node_id, node.pid, signal.SIGKILL)
        self.faults.refuse(node_id)
        _wait_gone(self.instance, node_id, node.pid, 10.0)

    def stop_node(self, node_id: int) -> None:
        """SIGTERM one broker: a controlled shutdown that hands its leaderships over first."""
        node = self.info.node(node_id)
        _signal(self.instance, node_id, node.pid, signal.SIGTERM)
        _wait_gone(self.instance, node_id, node.pid, local.STOP_TIMEOUT_S)
        self.faults.refuse(node_id)

    def start_node(self, node_id: int) -> None:
        """Start a stopped broker on its ports with its data; returns once it serves metadata."""
        node = self.info.node(node_id)
        if self.is_up(node_id):
            return
        node.pid = _spawn(self.instance, node_id, BROKER_HEAP)
        write_info(self.info)
        self.faults.accept(node_id)
        self._await_broker(node)

    def restart(self, node_id: int, wait_in_sync: bool = True) -> None:
        self.stop_node(node_id)
        self.start_node(node_id)
        if wait_in_sync:
            self.wait_in_sync()

    def _await_broker(self, node: Node) -> None:
        name = node_instance(self.instance, node.node_id)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not local.answers_metadata(f"127.0.0.1:{node.internal_port}", timeout_s=1.0):
            if not local.pid_alive(node.pid):
                raise local.SetupError(
                    f"broker node {node.node_id} exited while starting.\n{local.tail(name, 25)}"
                )
            if time.monotonic() > deadline:
                raise local.SetupError(
                    f"broker node {node.node_id} did not answer within {READY_TIMEOUT_S:.0f}s.\n"
                    f"{local.tail(name, 25)}\nFix: check memory/CPU load."
                )
            time.sleep(0.25)

    def registered_brokers(self, timeout_s: float = 5.0) -> set[int]:
        metadata = _admin(self.direct_bootstrap).list_topics(timeout=timeout_s)
        return set(metadata.brokers)

    def partitions(self, topic: str, timeout_s: float = 5.0) -> dict[int, Any]:
        """Partition id -> metadata (leader, replicas, isrs) of one topic, seen directly."""
        metadata = _admin(self.direct_bootstrap).list_topics(topic=topic, timeout=timeout_s)
        return dict(metadata.topics[topic].partitions)

    def leaders(self, topic: str) -> dict[int, int]:
        return {p: meta.leader for p, meta in self.partitions(topic).items()}

    def transaction_coordinator(self) -> int:
        """The broker leading the (single) transaction state partition."""
        return self.leaders("__transaction_state")[0]

    def group_coordinator(self) -> int:
        """The broker leading the (single) consumer offsets partition: every group's coordinator."""
        return self.leaders("__consumer_offsets")[0]

    def make_preferred_leader(self, topic: str, partition: int, node_id: int) -> None:
        """Put `node_id` first in the partition's replicas and elect it leader: the same replica
        set reordered, so no data moves, and `wait_balanced` keeps it there afterwards. Where the
        brokers put a coordinator is drawn when its topic is created; a test uses this to choose
        (e.g. the group coordinator on the broker it kills). The reassignment API is Java-only."""
        source = Path(__file__).resolve().parent / "kafka" / "PreferredLeader.java"
        command = [
            local.require_tool("java", local.JAVA_FIX),
            "-Xmx128m",
            "-cp",
            f"{local.LIBS}/*",
            str(source),
            self.direct_bootstrap,
            topic,
            str(partition),
            str(node_id),
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise local.SetupError(
                f"making node {node_id} the leader of {topic}/{partition} failed: "
                f"{(done.stdout + done.stderr)[-800:]}"
            )
        deadline = time.monotonic() + ISR_TIMEOUT_S
        while self.leaders(topic).get(partition) != node_id:
            if time.monotonic() > deadline:
                raise local.SetupError(
                    f"node {node_id} did not become leader of {topic}/{partition}"
                )
            time.sleep(0.2)

    def under_replicated(self) -> list[str]:
        """`topic/partition` of every partition whose ISR lacks one of its replicas."""
        metadata = _admin(self.direct_bootstrap).list_topics(timeout=5.0)
        return [
            f"{name}/{p}"
            for name, topic in metadata.topics.items()
            for p, meta in topic.partitions.items()
            if len(meta.isrs) < len(meta.replicas)
        ]

    def recover(self) -> None:
        """Every fault healed, every broker running, every partition's ISR full."""
        self.faults.heal()
        for node_id in self.node_ids:
            self.start_node(node_id)
        self.wait_in_sync()
        self.wait_balanced()

    def wait_balanced(self, timeout_s: float = ISR_TIMEOUT_S) -> None:
        """Wait until every partition is led by its preferred (first) replica."""
        deadline = time.monotonic() + timeout_s
        while True:
            metadata = _admin(self.direct_bootstrap).list_topics(timeout=5.0)
            astray = [
                f"{name}/{p}"
                for name, topic in metadata.topics.items()
                for p, meta in topic.partitions.items()
                if meta.replicas and meta.leader != meta.replicas[0]
            ]
            if not astray:
                return
            if time.monotonic() > deadline:
                raise local.SetupError(
                    f"leadership not back on the preferred replicas after {timeout_s:.0f}s: "
                    f"{', '.join(astray[:5])}. Fix: read the controller log."
                )
            time.sleep(0.5)

    def wait_in_sync(self, timeout_s: float = ISR_TIMEOUT_S) -> float:
        """Wait until every replica of every partition is in its ISR; returns seconds waited."""
        started = time.monotonic()
        lagging: list[str] = ["(not asked yet)"]
        while time.monotonic() - started < timeout_s:
            try:
                lagging = self.under_replicated()
            except Exception as exc:  # a broker just (re)starting: ask again
                lagging = [f"metadata failed: {exc}"]
            if not lagging:
                return time.monotonic() - started
            time.sleep(0.5)
        raise local.SetupError(
            f"ISR not full after {timeout_s:.0f}s: {', '.join(lagging[:5])}. "
            "Fix: read the broker logs (kafka_cluster logs --node N)."
        )


def start(instance: str, fresh: bool, nodes: int = 3) -> Cluster:
    running = read_info(instance)
    if running is not None and _alive(instance, CONTROLLER_ID, running.controller_pid):
        cluster = Cluster(running)
        for node_id in cluster.node_ids:
            cluster.start_node(node_id)  # a node killed by a test comes back
        print(f"kafka_cluster: '{instance}' already running at {cluster.bootstrap}")
        return cluster
    if running is not None:
        stop(instance)
    local.ensure_jars()
    proxy_binary = toxiproxy.binary()
    folder = home(instance)
    if fresh and folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    free = local.free_port
    info = ClusterInfo(
        instance=instance,
        cluster_id=local.new_cluster_id(),
        controller_port=free(),
        proxy_api_port=free(),
        nodes=[Node(i, free(), free(), free()) for i in range(1, nodes + 1)],
    )
    started = time.monotonic()
    _format(instance, CONTROLLER_ID, _controller_props(info), info.cluster_id)
    for node in info.nodes:
        _format(instance, node.node_id, _broker_props(info, node), info.cluster_id)
    print(f"kafka_cluster: starting toxiproxy ({proxy_binary}), 1 controller, {nodes} brokers")
    info.proxy_pid = toxiproxy.start_server(info.proxy_api_port, folder / "toxiproxy.log")
    write_info(info)
    cluster = Cluster(info)
    for node in info.nodes:
        cluster.faults.create(f"node-{node.node_id}", node.proxy_port, node.client_port)
    info.controller_pid = _spawn(instance, CONTROLLER_ID, CONTROLLER_HEAP)
    for node in info.nodes:
        node.pid = _spawn(instance, node.node_id, BROKER_HEAP)
    write_info(info)
    try:
        for node in info.nodes:
            cluster._await_broker(node)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while cluster.registered_brokers() != set(cluster.node_ids):
            if time.monotonic() > deadline:
                raise local.SetupError("not every broker registered with the controller.")
            time.sleep(0.25)
    except Exception:
        stop(instance)
        raise
    print(
        f"kafka_cluster: Apache Kafka {local.KAFKA_VERSION} cluster '{instance}' up in "
        f"{time.monotonic() - started:.1f}s: bootstrap {cluster.bootstrap} (through the proxy), "
        f"direct {cluster.direct_bootstrap}"
    )
    return cluster


def stop(instance: str) -> None:
    info = read_info(instance)
    if info is None:
        print(f"kafka_cluster: '{instance}' is not running")
        return
    for node in info.nodes:
        _signal(instance, node.node_id, node.pid, signal.SIGTERM)
    for node in info.nodes:
        _wait_gone(instance, node.node_id, node.pid, local.STOP_TIMEOUT_S)
    _signal(instance, CONTROLLER_ID, info.controller_pid, signal.SIGTERM)
    _wait_gone(instance, CONTROLLER_ID, info.controller_pid, local.STOP_TIMEOUT_S)
    if info.proxy_pid > 0 and _is_our_proxy(info.proxy_pid, info.proxy_api_port):
        os.killpg(info.proxy_pid, signal.SIGTERM)
    info_path(instance).unlink(missing_ok=True)
    print(f"kafka_cluster: '{instance}' stopped")


def _is_our_proxy(pid: int, port: int) -> bool:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return str(port).encode() in args and any(a.endswith(b"toxiproxy-server") for a in args)


def connect(instance: str) -> Cluster:
    info = read_info(instance)
    if info is None:
        raise local.SetupError(f"cluster '{instance}' is not running. Fix: start it first.")
    return Cluster(info)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kafka_cluster", description=__doc__.splitlines()[0])
    parser.add_argument(
        "command",
        choices=[
            "start",
            "stop",
            "kill",
            "restart",
            "status",
            "bootstrap",
            "direct-bootstrap",
            "logs",
        ],
    )
    parser.add_argument("--instance", default="cluster", help="name of the cluster")
    parser.add_argument("--nodes", type=int, default=3, help="brokers to start (default 3)")
    parser.add_argument("--node", type=int, help="one broker's node id (1..nodes)")
    parser.add_argument("--fresh", action="store_true", help="wipe the cluster's data first")
    parser.add_argument("--lines", type=int, default=60, help="log lines for `logs`")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.nodes > 8:
        parser.error("--nodes must be 1-8")
    if args.command in ("kill", "restart") and args.node is None:
        parser.error(f"`{args.command}` needs --node N")
    try:
        if args.command == "start" and args.node is None:
            start(args.instance, args.fresh, args.nodes)
        elif args.command == "stop" and args.node is None:
            stop(args.instance)
        elif args.command == "logs":
            name = node_instance(args.instance, args.node or CONTROLLER_ID)
            print(local.tail(name, args.lines))
        else:
            cluster = connect(args.instance)
            if args.command == "kill":
                cluster.kill(args.node)
            elif args.command == "stop":
                cluster.stop_node(args.node)
            elif args.command == "start":
                cluster.start_node(args.node)
            elif args.command == "restart":
                cluster.restart(args.node)
            elif args.command == "bootstrap":
                print(cluster.bootstrap)
            elif args.command == "direct-bootstrap":
                print(cluster.direct_bootstrap)
            else:
                up = {n: cluster.is_up(n) for n in cluster.node_ids}
                print(
                    json.dumps({**asdict(cluster.info), "up": up, "bootstrap": cluster.bootstrap})
                )
    except (local.SetupError, toxiproxy.ProxyError) as exc:
        print(f"kafka_cluster: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
