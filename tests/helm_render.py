"""Render the chart with the real Helm (built once into the tools cache, tools/deploy_tools.py)
and parse the output, for tests that check what the chart would deploy."""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tools import deploy_tools

CHART = Path(__file__).resolve().parents[1] / "helm" / "reconciler"
Manifest = dict[str, Any]


@cache
def helm_binary() -> Path:
    return deploy_tools.helm()


def helm_template(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm_binary()), "template", "reconciler", str(CHART), "--namespace", "agents", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def render(*args: str) -> list[Manifest]:
    """Every object of the render, in order; a failed render fails with Helm's message."""
    proc = helm_template(*args)
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def one(manifests: list[Manifest], kind: str) -> Manifest:
    found = [m for m in manifests if m["kind"] == kind]
    assert len(found) == 1, f"{len(found)} objects of kind {kind}"
    return found[0]


def engine_env(
    manifests: list[Manifest], secrets: dict[str, dict[str, str]] | None = None
) -> dict[str, str]:
    """The engine container's environment as the kubelet would build it: plain values, and
    secretKeyRef values looked up in `secrets` (Secret name -> data). fieldRef is left out."""
    pod = one(manifests, "StatefulSet")["spec"]["template"]["spec"]
    (container,) = (c for c in pod["containers"] if c["name"] == "engine")
    env: dict[str, str] = {}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = str(var["value"])
        elif "secretKeyRef" in var.get("valueFrom", {}):
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = (secrets or {})[ref["name"]][ref["key"]]
    return env
