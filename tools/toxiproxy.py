"""A real TCP fault proxy (Toxiproxy) in front of each broker, and a small client for its API.

    python -m tools.toxiproxy build     # build it once into the tool cache, print its path

The server is built once from the Go module proxy with `go install` into the cache outside the
clone (`~/.cache/reconciler/tools/toxiproxy-<version>/toxiproxy-server`, tools/cache.py), the
same way tools/deploy_tools.py builds Helm. tools/kafka_cluster.py starts one server per
cluster on loopback and one proxy per broker; every client of the cluster's `bootstrap` goes
through them, while inter-broker and controller traffic uses another listener and never does,
so a fault here isolates clients only.

`FaultProxy` talks to the server's HTTP API with the standard library, and every call has its
own deadline (`API_TIMEOUT_S`): a wedged proxy fails the test instead of hanging it. The faults:

- `partition(node)` / `partition_all()`: the client side of a broker stops answering. Data sent
  is held, nothing comes back, connections stay open (a `timeout` toxic with no timeout): what
  a dropped route or a silent firewall looks like, the hardest case for a client.
- `refuse(node)`: the proxy is disabled; connections are closed and new ones refused.
- `latency(ms)`: added to every answer of every broker.
- `bandwidth(kb_per_s)`: both directions capped.
- `reset_connections(after_ms)`: connections are reset (TCP RST) `after_ms` after data arrives.
- `heal()`: every toxic removed and every proxy enabled.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

try:
    from tools.cache import fresh_dir, is_complete, mark_complete, tool_dir
except ModuleNotFoundError:  # run from tools/kafka_cluster.py as a script: tools/ is on sys.path
    from cache import fresh_dir, is_complete, mark_complete, tool_dir  # type: ignore[import-not-found,no-redef]

TOXIPROXY_VERSION = "2.12.0"
TOXIPROXY_MODULE = f"github.com/Shopify/toxiproxy/v2/cmd/server@v{TOXIPROXY_VERSION}"
API_TIMEOUT_S = 5.0
START_TIMEOUT_S = 20.0


class ProxyError(Exception):
    """The fault proxy could not be built, started or driven; the message names the fix."""


def binary() -> Path:
    """The toxiproxy-server binary, built with `go install` the first time."""
    folder = tool_dir("toxiproxy", TOXIPROXY_VERSION)
    server = folder / "toxiproxy-server"
    if is_complete(folder):
        return server
    go = shutil.which("go")
    if go is None:
        raise ProxyError("`go` is not on PATH. Fix: install Go 1.24+ (it builds Toxiproxy once).")
    fresh_dir(folder)
    print(f"toxiproxy: building Toxiproxy {TOXIPROXY_VERSION} with go install (once) ...")
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as gobin:
        env = {**os.environ, "GOBIN": gobin, "CGO_ENABLED": "0"}
        proc = subprocess.run(
            ["nice", "-n", "10", go, "install", TOXIPROXY_MODULE],
            capture_output=True,
            text=True,
            check=False,
            env=env,
        )
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise ProxyError(
                f"go install {TOXIPROXY_MODULE} failed (exit {proc.returncode}):\n{tail}\n"
                "Fix: check that the Go module proxy is reachable (GOPROXY), then run again."
            )
        shutil.move(str(Path(gobin) / "server"), server)
    mark_complete(folder)
    print(f"toxiproxy: ready in {time.monotonic() - started:.0f}s")
    return server


def start_server(port: int, log: Path) -> int:
    """Start toxiproxy-server on 127.0.0.1:port in its own session; returns its pid."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [str(binary()), "-host", "127.0.0.1", "-port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    api = FaultProxy(port)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not api.answers():
        if proc.poll() is not None:
            raise ProxyError(f"toxiproxy-server exited with {proc.returncode}. Fix: read {log}.")
        if time.monotonic() > deadline:
            proc.kill()
            raise ProxyError(f"toxiproxy-server did not answer in {START_TIMEOUT_S:.0f}s: {log}")
        time.sleep(0.1)
    return proc.pid


class FaultProxy:
    """The HTTP API of one toxiproxy-server; proxies are named `node-<id>`."""

    def __init__(self, port: int, timeout_s: float = API_TIMEOUT_S) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.base + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise ProxyError(f"{method} {path}: HTTP {exc.code} {detail}") from exc
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise ProxyError(
                f"{method} {path}: no answer from toxiproxy at {self.base} ({exc}). "
                "Fix: check that the cluster's proxy is running (kafka_cluster status)."
            ) from exc
        return json.loads(raw) if raw.strip() else None

    def answers(self) -> bool:
        try:
            self._call("GET", "/version")
        except ProxyError:
            return False
        return True

    def create(self, name: str, listen_port: int, upstream_port: int) -> None:
        self._call(
            "POST",
            "/proxies",
            {
                "name": name,
                "listen": f"127.0.0.1:{listen_port}",
                "upstream": f"127.0.0.1:{upstream_port}",
                "enabled": True,
            },
        )

    def names(self) -> list[str]:
        return sorted(self._call("GET", "/proxies"))

    def _toxic(self, proxy: str, name: str, kind: str, stream: str, **attributes: int) -> None:
        self._call(
            "POST",
            f"/proxies/{proxy}/toxics",
            {
                "name": name,
                "type": kind,
                "stream": stream,
                "toxicity": 1.0,
                "attributes": attributes,
            },
        )

    def partition(self, node: int) -> None:
        """Nothing comes back from this broker; connections stay open (a silent drop)."""
        self._toxic(f"node-{node}", "partition", "timeout", "upstream", timeout=0)

    def partition_all(self) -> None:
        for name in self.names():
            self._toxic(name, "partition", "timeout", "upstream", timeout=0)

    def refuse(self, node: int) -> None:
        """Connections to this broker are closed and new ones refused."""
        self._call("POST", f"/proxies/node-{node}", {"enabled": False})

    def accept(self, node: int) -> None:
        """Undo `refuse`: the broker's proxy listens again."""
        self._call("POST", f"/proxies/node-{node}", {"enabled": True})

    def latency(self, ms: int, jitter_ms: int = 0) -> None:
        for name in self.names():
            self._toxic(name, "latency", "latency", "downstream", latency=ms, jitter=jitter_ms)

    def bandwidth(self, kb_per_s: int) -> None:
        for name in self.names():
            for stream in ("upstream", "downstream"):
                self._toxic(name, f"bandwidth-{stream}", "bandwidth", stream, rate=kb_per_s)

    def reset_connections(self, after_ms: int = 0) -> None:
        for name in self.names():
            self._toxic(name, "reset", "reset_peer", "upstream", timeout=after_ms)

    def heal(self) -> None:
        for name in self.names():
            self._call("POST", f"/proxies/{name}", {"enabled": True})
            for toxic in self._call("GET", f"/proxies/{name}/toxics"):
                self._call("DELETE", f"/proxies/{name}/toxics/{toxic['name']}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["build"]:
        print("usage: python -m tools.toxiproxy build", file=sys.stderr)
        return 2
    try:
        print(binary())
    except ProxyError as exc:
        print(f"toxiproxy: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
