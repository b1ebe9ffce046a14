"""Install the deploy-check tools once, into the cache outside the clone (tools/cache.py).

    python -m tools.deploy_tools          # install what is missing, print each tool's path

- Helm 4.3.2, built from the Go module proxy with `go install` (several minutes on 2 cores,
  once per machine): `~/.cache/reconciler/tools/helm-4.3.2/helm`.
- kubernetes-validate (PyPI; it ships the Kubernetes schemas) in its own virtualenv:
  `~/.cache/reconciler/tools/kubernetes-validate-1.37.0/bin/kubernetes-validate`.
- promtool and prometheus from Debian's `prometheus` package: installed with apt-get when
  missing and running as root (as CI does); otherwise the error says what to install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools.cache import fresh_dir, is_complete, mark_complete, tool_dir

HELM_VERSION = "4.3.2"
HELM_MODULE = f"helm.sh/helm/v4/cmd/helm@v{HELM_VERSION}"
KUBERNETES_VALIDATE_VERSION = "1.37.0"


class ToolError(Exception):
    """A tool could not be installed; the message names the cause and the fix."""


def _run(cmd: list[str], what: str, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise ToolError(f"{what} failed (exit {proc.returncode}):\n{tail}")


def helm() -> Path:
    folder = tool_dir("helm", HELM_VERSION)
    binary = folder / "helm"
    if is_complete(folder):
        return binary
    go = shutil.which("go")
    if go is None:
        raise ToolError("`go` is not on PATH. Fix: install Go 1.24+ (it builds Helm once).")
    fresh_dir(folder)
    print(f"deploy_tools: building Helm {HELM_VERSION} with go install (once) ...", flush=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as gobin:
        env = {**os.environ, "GOBIN": gobin, "CGO_ENABLED": "0"}
        # nice: the build takes both cores for minutes; tests and brokers keep priority.
        _run(["nice", "-n", "10", go, "install", HELM_MODULE], "go install helm", env)
        shutil.move(str(Path(gobin) / "helm"), binary)
    mark_complete(folder)
    print(f"deploy_tools: Helm ready in {time.monotonic() - started:.0f}s", flush=True)
    return binary


def kubernetes_validate() -> Path:
    folder = tool_dir("kubernetes-validate", KUBERNETES_VALIDATE_VERSION)
    binary = folder / "bin" / "kubernetes-validate"
    if is_complete(folder):
        return binary
    fresh_dir(folder)
    print("deploy_tools: installing kubernetes-validate (once) ...", flush=True)
    _run([sys.executable, "-m", "venv", str(folder)], "python -m venv")
    pip = [str(folder / "bin" / "pip"), "install", "--quiet"]
    _run([*pip, f"kubernetes-validate=={KUBERNETES_VALIDATE_VERSION}"], "pip install")
    mark_complete(folder)
    return binary


def promtool() -> Path:
    """promtool (and the prometheus server beside it) from Debian's package."""
    found = shutil.which("promtool")
    if found is not None and shutil.which("prometheus") is not None:
        return Path(found)
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ToolError(
            "promtool/prometheus are not installed. "
            "Fix: apt-get install prometheus (Debian's package ships both)."
        )
    print("deploy_tools: apt-get install prometheus (once) ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _run(["apt-get", "update", "-q"], "apt-get update", env)
    # policy-rc.d on this kind of machine keeps the packaged service from starting; the tests
    # start their own server on loopback.
    _run(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", "prometheus"],
        "apt-get install prometheus",
        env,
    )
    found = shutil.which("promtool")
    if found is None:
        raise ToolError("apt-get installed prometheus but promtool is not on PATH.")
    return Path(found)


def prometheus() -> Path:
    promtool()
    found = shutil.which("prometheus")
    if found is None:
        raise ToolError("prometheus is not on PATH. Fix: apt-get install prometheus.")
    return Path(found)


def main() -> int:
    try:
        for name, path in (
            ("helm", helm()),
            ("kubernetes-validate", kubernetes_validate()),
            ("promtool", promtool()),
        ):
            print(f"{name}: {path}")
    except ToolError as exc:
        print(f"deploy_tools: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
