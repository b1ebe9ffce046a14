"""The Helm chart agrees with the engine: settings, metric names, probe paths (no helm binary).

PyYAML is not a dependency, so values.yaml is read with a small key-path reader that handles
the subset the chart uses (nested maps of scalars, lists, comments). Templates are Go-template
text, so they are checked as text: what they name must exist in the engine's code.
"""

from __future__ import annotations

import io
import re
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from engine.cli import build_parser
from engine.runtime import metrics as metrics_module
from engine.runtime.metrics import EngineMetrics, serve_health
from engine.settings import KAFKA_ENV_PREFIX, Settings, load_settings

CHART = Path(__file__).resolve().parents[2] / "helm" / "reconciler"
TEMPLATES = CHART / "templates"

_KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.\-/]+):(?P<rest>.*)$")
_ENV_NAME = re.compile(r"\bRECONCILER_[A-Z0-9_]+")
_ENV_FROM_VALUES = re.compile(
    r"- name: (?P<env>RECONCILER_[A-Z0-9_]+)\n\s+value: \{\{ \.Values\.(?P<path>[A-Za-z0-9_.]+)"
)
_VALUES_REF = re.compile(r"\.Values\.(?P<path>[A-Za-z][A-Za-z0-9_.]*)")
_METRIC = re.compile(r"\breconciler_[a-z0-9_]+")


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _template_text() -> str:
    return "\n".join(_read(p) for p in sorted(TEMPLATES.iterdir()) if p.is_file())


def value_paths(text: str) -> dict[str, str]:
    """Dotted key path -> raw scalar ('' for a map or list) of every key in a values file."""
    paths: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith(("#", "-")):
            continue
        match = _KEY_LINE.match(line)
        if match is None:
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"]))
        raw = match["rest"].split(" #", 1)[0].strip().strip('"')
        paths[".".join(key for _, key in stack)] = raw
    return paths


def test_value_paths_reader_handles_nesting_and_comments() -> None:
    text = 'a: 1\nb:\n  # note\n  c: "x"  # why\n  d:\n    - e: 2\nf: {}\n'
    assert value_paths(text) == {"a": "1", "b": "", "b.c": "x", "b.d": "", "f": "{}"}


VALUES = value_paths(_read(CHART / "values.yaml"))


def test_chart_metadata() -> None:
    chart = value_paths(_read(CHART / "Chart.yaml"))
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "reconciler"
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"])
    for name in ("_helpers.tpl", "NOTES.txt", "statefulset.yaml", "prometheusrule.yaml"):
        assert (TEMPLATES / name).is_file(), name
    assert (CHART / "README.md").is_file()


def test_every_values_reference_exists_in_values_yaml() -> None:
    referenced = {m["path"] for m in _VALUES_REF.finditer(_template_text())}
    assert referenced, "no .Values references found: the regex or the templates changed"
    missing = sorted(path for path in referenced if path not in VALUES)
    assert not missing, f"templates use values that values.yaml does not define: {missing}"


def test_every_reconciler_env_var_is_a_settings_field_or_kafka_pass_through() -> None:
    names = set(_ENV_NAME.findall(_template_text()))
    assert KAFKA_ENV_PREFIX in names, "librdkafka pass-through env vars are not rendered"
    fields = set(Settings.model_fields) - {"kafka"}
    unknown = sorted(
        name
        for name in names - {KAFKA_ENV_PREFIX}
        if name.removeprefix("RECONCILER_").lower() not in fields
    )
    assert not unknown, f"env vars that engine.settings.Settings does not read: {unknown}"
    needed = {
        "bootstrap_servers",
        "topic_prefix",
        "partitions",
        "group_id",
        "instance_id",
        "state_dir",
        "commit_interval_ms",
        "transaction_timeout_ms",
        "session_timeout_ms",
        "metrics_port",
    }
    rendered = {name.removeprefix("RECONCILER_").lower() for name in names}
    assert needed <= rendered, f"settings the chart never sets: {sorted(needed - rendered)}"


def test_default_values_render_to_valid_settings() -> None:
    text = _template_text()
    env = {m["env"]: VALUES[m["path"]] for m in _ENV_FROM_VALUES.finditer(text)}
    assert len(env) >= 9, env
    env["RECONCILER_INSTANCE_ID"] = "reconciler-0"  # what the downward API gives pod 0
    settings = load_settings(None, env)
    assert settings.partitions == int(VALUES["partitions"])
    assert settings.metrics_port == int(VALUES["metricsPort"])
    assert settings.state_dir == Path(VALUES["stateDir"])
    assert int(VALUES["replicaCount"]) <= settings.partitions
    grace_ms = int(VALUES["terminationGracePeriodSeconds"]) * 1000
    assert grace_ms > settings.transaction_timeout_ms


def test_instance_id_comes_from_the_pod_name() -> None:
    statefulset = _read(TEMPLATES / "statefulset.yaml")
    assert re.search(
        r"- name: RECONCILER_INSTANCE_ID\n\s+valueFrom:\n\s+fieldRef:\n\s+fieldPath: metadata.name",
        statefulset,
    )
    assert re.search(r"^kind: StatefulSet$", statefulset, re.MULTILINE)
    assert "podManagementPolicy: Parallel" in statefulset
    assert "volumeClaimTemplates:" in statefulset
    assert 'command: ["reconciler", "run"]' in statefulset
    assert build_parser().parse_args(["run"]).command == "run"
    job = _read(TEMPLATES / "topics-job.yaml")
    assert 'command: ["reconciler", "topics", "create"]' in job
    assert build_parser().parse_args(["topics", "create"]).topics_command == "create"


@pytest.mark.parametrize(
    "key", ["security.protocol", "sasl.mechanism", "sasl.password", "ssl.ca.location"]
)
def test_kafka_keys_survive_the_chart_env_encoding(key: str) -> None:
    # The template renders `RECONCILER_KAFKA__{{ $key | upper | replace "." "_" }}`.
    helpers = _read(TEMPLATES / "_helpers.tpl")
    assert helpers.count('RECONCILER_KAFKA__{{ $key | upper | replace "." "_" }}') == 2
    env = {KAFKA_ENV_PREFIX + key.upper().replace(".", "_"): "v"}
    assert load_settings(None, env).kafka == {key: "v"}


def test_secrets_come_from_a_secret_never_from_values() -> None:
    helpers = _read(TEMPLATES / "_helpers.tpl")
    assert "secretKeyRef:" in helpers
    assert "{{ $.Values.kafkaSecret.name }}" in helpers
    assert 'contains "password"' in helpers, "the chart no longer refuses inline passwords"
    inline = [path for path in VALUES if path.startswith("kafka.")]
    assert not inline, f"values.yaml sets librdkafka keys by default: {inline}"


def _exported_metric_names() -> set[str]:
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    names: set[str] = set()
    for family in EngineMetrics().registry.collect():
        names.update(family.name + suffix for suffix in suffixes[family.type])
    return names


def test_alert_rules_use_only_metrics_the_engine_exports() -> None:
    exported = _exported_metric_names()
    assert "reconciler_gate_violations_total" in exported  # the registry read is sound
    rules = _read(TEMPLATES / "prometheusrule.yaml")
    used = set(_METRIC.findall(rules))
    unknown = sorted(used - exported)
    assert not unknown, f"alert rules name metrics the engine does not export: {unknown}"
    required = {
        "reconciler_gate_violations_total",
        "reconciler_alerts_total",
        "reconciler_dead_letters_total",
        "reconciler_oldest_pending_write_age_seconds",
        "reconciler_consumer_lag",
        "reconciler_transaction_aborts_total",
        "reconciler_ready",
    }
    assert required <= used, f"alerts missing for: {sorted(required - used)}"
    docs = _template_text() + _read(CHART / "README.md")
    assert not sorted(set(_METRIC.findall(docs)) - exported)


class _FakeServer:
    """Stands in for ThreadingHTTPServer so the handler runs without a socket."""

    handler: type[BaseHTTPRequestHandler] | None = None

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        _FakeServer.handler = handler

    def serve_forever(self) -> None:
        return


def _get(handler: type[BaseHTTPRequestHandler], path: str) -> int:
    request = handler.__new__(handler)
    request.path = path
    request.command = "GET"
    request.request_version = "HTTP/1.1"
    request.requestline = f"GET {path} HTTP/1.1"
    request.client_address = ("test", 0)
    out = io.BytesIO()
    request.wfile = out
    request.do_GET()  # type: ignore[attr-defined]  # defined by serve_health's handler
    status_line = out.getvalue().split(b"\r\n", 1)[0]
    return int(status_line.split()[1])


def test_probe_paths_are_the_ones_the_engine_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    statefulset = _read(TEMPLATES / "statefulset.yaml")
    probes = dict(
        re.findall(r"(livenessProbe|readinessProbe):\n\s+httpGet:\n\s+path: (\S+)", statefulset)
    )
    assert set(probes) == {"livenessProbe", "readinessProbe"}
    assert statefulset.count("port: metrics") == 2
    monitor_path = re.search(r"path: (\S+)", _read(TEMPLATES / "servicemonitor.yaml"))
    assert monitor_path is not None

    monkeypatch.setattr(metrics_module, "ThreadingHTTPServer", _FakeServer)
    metrics = EngineMetrics()
    serve_health(metrics, 0)
    handler = _FakeServer.handler
    assert handler is not None
    assert _get(handler, "/no-such-path") == 404
    assert _get(handler, probes["livenessProbe"]) == 200
    assert _get(handler, monitor_path[1]) == 200
    assert _get(handler, probes["readinessProbe"]) == 503  # not ready before restore
    metrics.set_ready(True)
    assert _get(handler, probes["readinessProbe"]) == 200
