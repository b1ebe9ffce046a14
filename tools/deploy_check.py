"""`make test-deploy`: the chart and the alert rules checked by the real tools.

1. `helm lint --strict` with the default values and with every optional feature on
   (tests/deploy/values-all-on.yaml);
2. `helm template` of both; every rendered object of a built-in kind is validated by
   kubernetes-validate --strict against the Kubernetes schemas of KUBERNETES_VERSION
   (ServiceMonitor and PrometheusRule are CRDs: the rules inside are checked by promtool);
3. `promtool check rules` and `promtool test rules` on helm/reconciler/files/alerts.rules.yaml.

Tools come from tools/deploy_tools.py (installed once into the cache outside the clone).
Prints the time of each step; exits 1 on the first failure with the tool's own message.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools import deploy_tools

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "helm" / "reconciler"
RULES = CHART / "files" / "alerts.rules.yaml"
RULE_TESTS = REPO / "tests" / "deploy" / "alerts.test.yaml"
ALL_ON = REPO / "tests" / "deploy" / "values-all-on.yaml"
KUBERNETES_VERSION = "1.33.0"
CUSTOM_KINDS = ("ServiceMonitor", "PrometheusRule")
# Values that a real install passes on the command line (the chart has no default for them).
REQUIRED_SETS: list[str] = []


class CheckError(Exception):
    pass


def run(cmd: list[str | Path], what: str) -> str:
    started = time.monotonic()
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=False)
    took = time.monotonic() - started
    if proc.returncode != 0:
        raise CheckError(f"{what}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
    print(f"  ok  {what} ({took:.1f}s)", flush=True)
    return proc.stdout


def render(helm: Path, values: list[str]) -> str:
    return run(
        [helm, "template", "reconciler", CHART, "--namespace", "agents", *REQUIRED_SETS, *values],
        f"helm template {' '.join(values) or '(defaults)'}",
    )


def split_documents(rendered: str) -> tuple[list[str], list[str]]:
    """(built-in kind documents, custom kind documents) of a multi-document render."""
    builtin: list[str] = []
    custom: list[str] = []
    for doc in rendered.split("\n---\n"):
        kinds = [ln.split(":", 1)[1].strip() for ln in doc.splitlines() if ln.startswith("kind:")]
        kind = kinds[0] if kinds else None
        if kind is None:
            continue
        (custom if kind in CUSTOM_KINDS else builtin).append(doc)
    return builtin, custom


def main() -> int:
    started = time.monotonic()
    try:
        helm = deploy_tools.helm()
        validate = deploy_tools.kubernetes_validate()
        promtool = deploy_tools.promtool()
        print(f"== test-deploy: tools ready ({time.monotonic() - started:.1f}s)", flush=True)
        for values in ([], ["-f", str(ALL_ON)]):
            run([helm, "lint", "--strict", CHART, *REQUIRED_SETS, *values], "helm lint")
            builtin, custom = split_documents(render(helm, values))
            if values and len(custom) != len(CUSTOM_KINDS):
                raise CheckError(f"all-on render has {len(custom)} custom objects, expected 2")
            with tempfile.TemporaryDirectory() as tmp:
                files = []
                for n, doc in enumerate(builtin):
                    path = Path(tmp) / f"{n:02d}.yaml"
                    path.write_text(doc, encoding="utf-8")
                    files.append(path)
                run(
                    [validate, "--strict", "--quiet", "-k", KUBERNETES_VERSION, *files],
                    f"kubernetes-validate {len(files)} objects (k8s {KUBERNETES_VERSION})",
                )
        run([promtool, "check", "rules", RULES], "promtool check rules")
        run([promtool, "test", "rules", RULE_TESTS], "promtool test rules")
    except (deploy_tools.ToolError, CheckError) as exc:
        print(f"test-deploy FAILED: {exc}", file=sys.stderr)
        return 1
    print(f"== test-deploy passed in {time.monotonic() - started:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
