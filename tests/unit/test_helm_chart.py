"""The Helm chart, rendered by the real Helm, agrees with the engine: settings, metric names,
probe paths, secrets, the embedded alert rules and dashboard.

`make test-deploy` (tools/deploy_check.py) lints the chart and validates every rendered object
against the Kubernetes schemas; these tests check what the objects say.
"""

from __future__ import annotations

import io
import json
import re
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine.admin.isr_watch import IsrWatch
from engine.cli import build_parser
from engine.runtime import metrics as metrics_module
from engine.runtime.metrics import EngineMetrics, serve_health
from engine.settings import KAFKA_ENV_PREFIX, Settings, load_settings
from tests.helm_render import CHART, Manifest, engine_env, helm_template, one, render

REPO = CHART.parents[1]
ALL_ON = REPO / "tests" / "deploy" / "values-all-on.yaml"
RULES_FILE = CHART / "files" / "alerts.rules.yaml"
DASHBOARD_FILE = CHART / "files" / "dashboard.json"
_METRIC = re.compile(r"\breconciler_[a-z0-9_]+")


@pytest.fixture(scope="module")
def defaults() -> list[Manifest]:
    return render()


@pytest.fixture(scope="module")
def all_on() -> list[Manifest]:
    return render("-f", str(ALL_ON))


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def test_chart_metadata() -> None:
    chart = _yaml(CHART / "Chart.yaml")
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "reconciler"
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"])
    assert (CHART / "README.md").is_file()


def test_kinds_rendered(defaults: list[Manifest], all_on: list[Manifest]) -> None:
    kinds = sorted(m["kind"] for m in defaults)
    assert kinds == sorted(
        ["ServiceAccount", "Service", "Service", "StatefulSet", "PodDisruptionBudget", "Job"]
    )
    extra = sorted({m["kind"] for m in all_on} - set(kinds))
    assert extra == ["ConfigMap", "PrometheusRule", "ServiceMonitor"]


def test_every_reconciler_env_var_is_a_settings_field_or_kafka_pass_through(
    all_on: list[Manifest],
) -> None:
    secrets = {"reconciler-kafka": {"username": "engine", "password": "pw"}}
    names = set(engine_env(all_on, secrets))
    fields = set(Settings.model_fields) - {"kafka"}
    unknown = sorted(
        name
        for name in names
        if name.startswith("RECONCILER_")
        and not name.startswith(KAFKA_ENV_PREFIX)
        and name.removeprefix("RECONCILER_").lower() not in fields
    )
    assert not unknown, f"env vars that engine.settings.Settings does not read: {unknown}"
    needed = {
        "bootstrap_servers",
        "topic_prefix",
        "partitions",
        "group_id",
        "state_dir",
        "commit_interval_ms",
        "transaction_timeout_ms",
        "session_timeout_ms",
        "metrics_port",
    }
    rendered = {name.removeprefix("RECONCILER_").lower() for name in names}
    assert needed <= rendered, f"settings the chart never sets: {sorted(needed - rendered)}"


def test_default_values_render_to_valid_settings(defaults: list[Manifest]) -> None:
    values = _yaml(CHART / "values.yaml")
    env = engine_env(defaults)
    env["RECONCILER_INSTANCE_ID"] = "reconciler-0"  # what the downward API gives pod 0
    settings = load_settings(None, env)
    assert settings.partitions == values["partitions"]
    assert settings.metrics_port == values["metricsPort"]
    assert settings.state_dir == Path(values["stateDir"])
    assert settings.kafka == {}
    statefulset = one(defaults, "StatefulSet")
    assert statefulset["spec"]["replicas"] <= settings.partitions
    grace_s = statefulset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace_s * 1000 > settings.transaction_timeout_ms


def test_instance_id_comes_from_the_pod_name(defaults: list[Manifest]) -> None:
    statefulset = one(defaults, "StatefulSet")
    assert statefulset["spec"]["podManagementPolicy"] == "Parallel"
    assert statefulset["spec"]["volumeClaimTemplates"]
    (engine,) = statefulset["spec"]["template"]["spec"]["containers"]
    by_name = {var["name"]: var for var in engine["env"]}
    field = by_name["RECONCILER_INSTANCE_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert field == "metadata.name"
    assert engine["command"] == ["reconciler", "run"]
    assert build_parser().parse_args(engine["command"][1:]).command == "run"
    (job_container,) = one(defaults, "Job")["spec"]["template"]["spec"]["containers"]
    assert job_container["command"] == ["reconciler", "topics", "create"]
    assert build_parser().parse_args(["topics", "create"]).topics_command == "create"


@pytest.mark.parametrize("key", ["security.protocol", "sasl.mechanism", "ssl.ca.location"])
def test_kafka_keys_survive_the_chart_env_encoding(key: str) -> None:
    manifests = render("--set-json", f"kafka={json.dumps({key: 'v'})}")
    assert load_settings(None, engine_env(manifests)).kafka == {key: "v"}


def test_sasl_credentials_come_from_the_named_secret(all_on: list[Manifest]) -> None:
    (engine,) = one(all_on, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    refs = {
        var["name"]: var["valueFrom"]["secretKeyRef"]
        for var in engine["env"]
        if "secretKeyRef" in var.get("valueFrom", {})
    }
    assert refs == {
        "RECONCILER_KAFKA__SASL_USERNAME": {"name": "reconciler-kafka", "key": "username"},
        "RECONCILER_KAFKA__SASL_PASSWORD": {"name": "reconciler-kafka", "key": "password"},
    }
    secrets = {"reconciler-kafka": {"username": "engine", "password": "s3cret"}}
    settings = load_settings(None, engine_env(all_on, secrets))
    assert settings.schema_registry_url == "http://registry.agents.svc:8080/apis/ccompat/v7"
    assert settings.log_format == "json"
    kafka = settings.kafka
    assert kafka["sasl.mechanism"] == "SCRAM-SHA-512"
    assert kafka["sasl.password"] == "s3cret"
    assert "s3cret" not in json.dumps(all_on)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "replicaCount=7", "--set", "partitions=6"], "replicaCount (7) > partitions"),
        (["--set", "metricsPort=0"], "metricsPort is 0"),
        (["--set", "terminationGracePeriodSeconds=10"], "must exceed transactionTimeoutMs"),
        (["--set", "commitIntervalMs=6000"], "must be at least commitIntervalMs (6000) + 5000"),
        (["--set", "kafka.sasl\\.password=x"], "looks secret"),
        (["--set", "sasl.enabled=true"], "sasl.existingSecret is empty"),
        (
            [
                "--set",
                "sasl.enabled=true,sasl.existingSecret=s",
                "--set",
                "kafka.sasl\\.mechanism=P",
            ],
            "set both by sasl",
        ),
    ],
)
def test_values_the_engine_cannot_work_with_are_refused(args: list[str], message: str) -> None:
    proc = helm_template(*args)
    assert proc.returncode != 0
    assert message in proc.stderr


def _exported_metric_names() -> set[str]:
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    names: set[str] = set()
    metrics = EngineMetrics()
    IsrWatch(load_settings(environ={}), metrics)  # its gauges go on the engine's registry
    for family in metrics.registry.collect():
        names.update(family.name + suffix for suffix in suffixes[family.type])
    return names


def test_the_prometheus_rule_is_the_rules_file_plus_routing_labels(all_on: list[Manifest]) -> None:
    rules_file = _yaml(RULES_FILE)
    rendered = one(all_on, "PrometheusRule")
    assert rendered["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    expected = [
        {
            "name": group["name"],
            "rules": [
                {**rule, "labels": {**rule.get("labels", {}), "team": "agents"}}
                for rule in group["rules"]
            ],
        }
        for group in rules_file["groups"]
    ]
    assert rendered["spec"]["groups"] == expected


def test_alert_rules_and_dashboard_use_only_metrics_the_engine_exports() -> None:
    exported = _exported_metric_names()
    rules = RULES_FILE.read_text(encoding="utf-8")
    dashboard = DASHBOARD_FILE.read_text(encoding="utf-8")
    for name, text in (("rules", rules), ("dashboard", dashboard)):
        unknown = sorted(set(_METRIC.findall(text)) - exported)
        assert not unknown, f"{name} name metrics the engine does not export: {unknown}"
    docs = (CHART / "README.md").read_text(encoding="utf-8")
    assert not sorted(set(_METRIC.findall(docs)) - exported)
    alerts = {rule["alert"] for group in _yaml(RULES_FILE)["groups"] for rule in group["rules"]}
    assert {
        "ReconcilerSessionNeedsRepair",
        "ReconcilerGateViolation",
        "ReconcilerWithheldResumesRising",
        "ReconcilerDeadLetters",
        "ReconcilerConsumerLag",
        "ReconcilerDecisionLatencyHigh",
        "ReconcilerNoProgress",
        "ReconcilerRestoreTooLong",
        "ReconcilerRestarting",
    } <= alerts


def test_every_alert_has_a_promtool_unit_test() -> None:
    alerts = {rule["alert"] for group in _yaml(RULES_FILE)["groups"] for rule in group["rules"]}
    tests = _yaml(REPO / "tests" / "deploy" / "alerts.test.yaml")["tests"]
    tested = {case["alertname"] for test in tests for case in test["alert_rule_test"]}
    assert alerts == tested
    firing = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    assert firing == alerts, f"alerts never shown firing: {sorted(alerts - firing)}"


def test_dashboard_config_map_carries_the_sidecar_label(all_on: list[Manifest]) -> None:
    config_map = one(all_on, "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Kafka"}
    (text,) = config_map["data"].values()
    dashboard = json.loads(text)
    assert dashboard == json.loads(DASHBOARD_FILE.read_text(encoding="utf-8"))
    titles = " ".join(panel["title"].lower() for panel in dashboard["panels"])
    for topic in ("throughput", "latency", "reason", "health", "lag", "dead", "commit", "restart"):
        assert topic in titles, topic


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


def test_probe_paths_are_the_ones_the_engine_serves(
    all_on: list[Manifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    (engine,) = one(all_on, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    liveness = engine["livenessProbe"]["httpGet"]
    readiness = engine["readinessProbe"]["httpGet"]
    assert liveness["port"] == readiness["port"] == "metrics"
    assert {p["name"] for p in engine["ports"]} == {"metrics"}
    (endpoint,) = one(all_on, "ServiceMonitor")["spec"]["endpoints"]

    monkeypatch.setattr(metrics_module, "ThreadingHTTPServer", _FakeServer)
    metrics = EngineMetrics()
    serve_health(metrics, 0)
    handler = _FakeServer.handler
    assert handler is not None
    assert _get(handler, "/no-such-path") == 404
    assert _get(handler, liveness["path"]) == 200
    assert _get(handler, endpoint["path"]) == 200
    assert _get(handler, readiness["path"]) == 503  # not ready before restore
    metrics.set_ready(True)
    assert _get(handler, readiness["path"]) == 200
