"""Run a real Schema Registry for development and tests: Apicurio Registry 3.3.3 with its
Confluent-compatible API (`<url>/apis/ccompat/v7`), in-memory storage, loopback only.

    python -m tools.registry_local start  [--instance NAME]
    python -m tools.registry_local stop   [--instance NAME]
    python -m tools.registry_local status [--instance NAME]
    python -m tools.registry_local url    [--instance NAME]   # the Confluent-compatible URL

The distribution (`io.apicurio:apicurio-registry-app:3.3.3`, tar.gz, classifier `all`, a
Quarkus fast-jar) comes from Maven Central through `mvn dependency:get` and is unpacked once
into the cache outside the clone (`~/.cache/reconciler/tools/apicurio-registry-3.3.3/`). It
needs Java 21+: `RECONCILER_REGISTRY_JAVA`, else the newest JDK under /usr/lib/jvm, else `java`.
Both the HTTP and the management interface bind to 127.0.0.1 (3.3.3 opens the management port
on every interface otherwise). Compatibility is set to BACKWARD globally (Apicurio's default is
NONE). Each instance keeps `registry.json` (pid, ports) and its log under `.registry/<name>/` in
the clone; `stop` ends that pid only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from tools.cache import fresh_dir, is_complete, mark_complete, tool_dir

VERSION = "3.3.3"
ARTIFACT = f"io.apicurio:apicurio-registry-app:{VERSION}:tar.gz:all"
REPO = Path(__file__).resolve().parent.parent
INSTANCES = REPO / ".registry"
START_TIMEOUT_S = float(os.environ.get("RECONCILER_REGISTRY_START_TIMEOUT", "120"))
STOP_TIMEOUT_S = 20.0
CCOMPAT = "/apis/ccompat/v7"


class RegistryError(Exception):
    """A failure the user can fix; the message names the cause and the fix."""


@dataclass
class RegistryInfo:
    pid: int
    port: int
    management_port: int

    @property
    def url(self) -> str:
        """Base URL of the Confluent-compatible API, as SchemaRegistryClient wants it."""
        return f"http://127.0.0.1:{self.port}{CCOMPAT}"


def home(instance: str) -> Path:
    return INSTANCES / instance


def _m2_tarball() -> Path:
    local = Path.home() / ".m2" / "repository" / "io" / "apicurio" / "apicurio-registry-app"
    return local / VERSION / f"apicurio-registry-app-{VERSION}-all.tar.gz"


def ensure_distribution() -> Path:
    """The unpacked distribution folder (with quarkus-run.jar), fetched once."""
    folder = tool_dir("apicurio-registry", VERSION)
    if is_complete(folder):
        return folder
    tarball = _m2_tarball()
    if not tarball.exists():
        mvn = shutil.which("mvn")
        if mvn is None:
            raise RegistryError("`mvn` is not on PATH. Fix: apt-get install maven.")
        print(f"registry_local: fetching {ARTIFACT} with Maven (once) ...", flush=True)
        proc = subprocess.run(
            [mvn, "-q", "-B", "dependency:get", f"-Dartifact={ARTIFACT}", "-Dtransitive=false"],
            capture_output=True,
            text=True,
            check=False,
            cwd=REPO / "tools" / "kafka",  # any folder; dependency:get needs no project
        )
        if proc.returncode != 0 or not tarball.exists():
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-10:])
            raise RegistryError(
                f"Maven could not fetch {ARTIFACT} (exit {proc.returncode}).\n{tail}\n"
                "Fix: check that Maven Central is reachable, then run again."
            )
    fresh_dir(folder)
    with tarfile.open(tarball) as archive:
        archive.extractall(folder, filter="data")
    if not (folder / "quarkus-run.jar").exists():
        raise RegistryError(f"{tarball} has no quarkus-run.jar. Fix: delete it and run again.")
    mark_complete(folder)
    return folder


def _java_major(java: str) -> int:
    proc = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    found = re.search(r'version "(\d+)', proc.stderr + proc.stdout)
    return int(found[1]) if found else 0


def find_java() -> str:
    """A Java 21+ runtime (Apicurio 3.3 is built for it)."""
    explicit = os.environ.get("RECONCILER_REGISTRY_JAVA")
    candidates = [explicit] if explicit else []
    candidates += sorted(
        (str(p) for p in Path("/usr/lib/jvm").glob("*/bin/java")), key=_natural, reverse=True
    )
    candidates.append(shutil.which("java") or "")
    for java in candidates:
        if java and Path(java).exists() and _java_major(java) >= 21:
            return java
    raise RegistryError(
        "no Java 21+ runtime found (RECONCILER_REGISTRY_JAVA, /usr/lib/jvm/*, PATH). "
        "Fix: install a JDK 21 or newer, or point RECONCILER_REGISTRY_JAVA at its bin/java."
    )


def _natural(text: str) -> list[int | str]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return True


def read_info(instance: str) -> RegistryInfo | None:
    path = home(instance) / "registry.json"
    if not path.exists():
        return None
    info = RegistryInfo(**json.loads(path.read_text()))
    return info if _alive(info.pid) else None


def _request(url: str, method: str = "GET", body: dict[str, str] | None = None) -> object:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/vnd.schemaregistry.v1+json")
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read() or b"null")


def _serves(info: RegistryInfo) -> bool:
    try:
        _request(f"{info.url}/subjects")
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return True


def start(instance: str) -> RegistryInfo:
    running = read_info(instance)
    if running is not None:
        print(f"registry_local: '{instance}' already running (pid {running.pid}) at {running.url}")
        return running
    dist = ensure_distribution()
    java = find_java()
    folder = home(instance)
    folder.mkdir(parents=True, exist_ok=True)
    port, management_port = _free_port(), _free_port()
    started = time.monotonic()
    with open(folder / "registry.log", "ab") as log:
        proc = subprocess.Popen(
            [
                java,
                "-Xms128m",
                "-Xmx512m",
                "-Dquarkus.http.host=127.0.0.1",
                f"-Dquarkus.http.port={port}",
                "-Dquarkus.management.host=127.0.0.1",
                f"-Dquarkus.management.port={management_port}",
                "-jar",
                str(dist / "quarkus-run.jar"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=folder,
            start_new_session=True,  # outlives this script; `stop` ends it by pid
        )
    info = RegistryInfo(pid=proc.pid, port=port, management_port=management_port)
    (folder / "registry.json").write_text(json.dumps(asdict(info)))
    while not _serves(info):
        if proc.poll() is not None:
            (folder / "registry.json").unlink(missing_ok=True)
            raise RegistryError(
                f"the registry exited with status {proc.returncode} while starting.\n"
                f"{_tail(instance)}\nFix: read {folder / 'registry.log'}."
            )
        if time.monotonic() - started > START_TIMEOUT_S:
            stop(instance)
            raise RegistryError(
                f"the registry did not answer within {START_TIMEOUT_S:.0f}s.\n{_tail(instance)}\n"
                "Fix: check memory/CPU load, or raise RECONCILER_REGISTRY_START_TIMEOUT."
            )
        time.sleep(0.3)
    # Apicurio's default is NONE: an incompatible change would be accepted.
    _request(f"{info.url}/config", "PUT", {"compatibility": "BACKWARD"})
    print(
        f"registry_local: Apicurio Registry {VERSION} '{instance}' up at {info.url} "
        f"(pid {info.pid}) in {time.monotonic() - started:.1f}s"
    )
    return info


def stop(instance: str) -> None:
    path = home(instance) / "registry.json"
    if not path.exists():
        print(f"registry_local: '{instance}' is not running")
        return
    info = RegistryInfo(**json.loads(path.read_text()))
    if _alive(info.pid):
        os.kill(info.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _alive(info.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(info.pid):
            os.kill(info.pid, signal.SIGKILL)
    path.unlink(missing_ok=True)
    print(f"registry_local: '{instance}' stopped")


def _tail(instance: str, lines: int = 25) -> str:
    log = home(instance) / "registry.log"
    if not log.exists():
        return "(no registry log)"
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="registry_local", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["start", "stop", "status", "url"])
    parser.add_argument("--instance", default="dev", help="name of the registry (default: dev)")
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            start(args.instance)
        elif args.command == "stop":
            stop(args.instance)
        else:
            info = read_info(args.instance)
            if info is None:
                print(f"registry_local: '{args.instance}' is not running", file=sys.stderr)
                return 1
            print(
                info.url if args.command == "url" else json.dumps({**asdict(info), "url": info.url})
            )
    except RegistryError as exc:
        print(f"registry_local: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
