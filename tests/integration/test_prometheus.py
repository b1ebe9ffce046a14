"""A real Prometheus (Debian's package, on loopback) scrapes a running engine under load and
evaluates the chart's rules file: every alert expression and every dashboard query is asked
over Prometheus' HTTP API, and the alert for an ambiguous session is seen firing."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from msgspec.structs import replace

from engine.core.events import AckOutcome, Event
from engine.runtime.process.health import serve_health
from engine.runtime.process.metrics import EngineMetrics
from tests.helm_render import CHART
from tests.integration.engine_harness import (
    engine_settings,
    engine_thread,
    produce,
    produce_raw,
    read_decisions,
)
from tests.unit.core.builders import ack, call, intent, msg, out, record, resume
from tools import deploy_tools

pytestmark = pytest.mark.kafka

RULES = CHART / "files" / "alerts.rules.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"
SESSIONS = 200
U, C, OUT = msg("charge 7"), call("charge-1"), out("charge-1")
# Grafana's variables, as Grafana would fill them for a short time range.
GRAFANA_VARS = {"$__rate_interval": "1m", "$__range": "5m"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Prometheus:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}/api/v1"

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.base}/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("query", query=expr)
        assert data["resultType"] == "vector", (expr, data)
        result: list[dict[str, Any]] = data["result"]
        return result


@pytest.fixture
def metrics_port() -> int:
    return _free_port()


@pytest.fixture
def prometheus(tmp_path: Path, metrics_port: int) -> Iterator[Prometheus]:
    """Prometheus on 127.0.0.1 scraping the engine every second, with the chart's rules."""
    port = _free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": "reconciler",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{metrics_port}"], "labels": {"pod": "engine-0"}}
                ],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [
            str(deploy_tools.prometheus()),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    client = Prometheus(port)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                client.get("status/buildinfo")
                break
            except OSError:
                assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "Prometheus did not answer within 30 s"
                time.sleep(0.2)
        yield client
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _sessions(prefix: str) -> list[Event]:
    events: list[Event] = []
    for n in range(SESSIONS):
        sid = f"{prefix}-s{n}"
        # Every 50th session's Session changed under it: ambiguous, withheld and alerted.
        tail = [U, C, msg("other writer")] if n % 50 == 7 else [U, C, OUT]
        for event in (
            intent("e1", [OUT], [U, C]),
            ack("e2", AckOutcome.UNKNOWN),
            resume("e3", record([OUT], [U, C]), tail),
        ):
            events.append(replace(event, session_id=sid, event_id=f"{sid}/{event.event_id}"))
    return events


def _wait_for(what: str, check: Any, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what} not seen within {timeout_s:.0f} s"
        time.sleep(1)


def test_real_prometheus_scrapes_the_engine_and_fires_for_an_ambiguous_session(
    kafka_bootstrap: str,
    unique_name: str,
    tmp_path: Path,
    metrics_port: int,
    prometheus: Prometheus,
) -> None:
    settings = engine_settings(kafka_bootstrap, unique_name, tmp_path / "state")
    metrics = EngineMetrics()
    server = serve_health(metrics, metrics_port)
    try:
        with engine_thread(settings, metrics):
            # The zero series must be scraped before the first increment, as in production
            # where the endpoint is up long before an alert; otherwise the first sample
            # already holds the count and increase() sees nothing.
            _wait_for(
                "a scrape of the engine's zero series",
                lambda: prometheus.query('reconciler_alerts_total{reason="AMBIGUOUS"} == 0'),
            )
            events = _sessions(unique_name)
            produce(kafka_bootstrap, settings, events)
            produce_raw(kafka_bootstrap, settings.topics.intents, [(b"bad", b"\x07junk")])
            ambiguous = SESSIONS // 50
            read_decisions(kafka_bootstrap, settings, until=len(events), timeout_s=120)

            firing = _wait_for(
                "ReconcilerDecisionNeedsOperator firing",
                lambda: [
                    a
                    for a in prometheus.get("alerts")["alerts"]
                    if a["labels"]["alertname"] == "ReconcilerDecisionNeedsOperator"
                    and a["state"] == "firing"
                ],
            )
            assert {a["labels"]["reason"] for a in firing} == {"AMBIGUOUS"}
            # The gauge behind ReconcilerSessionNeedsRepair (its `for: 1m` is not waited out).
            unhealthy = _wait_for(
                "sessions_by_health AMBIGUOUS",
                lambda: prometheus.query('reconciler_sessions_by_health{health="AMBIGUOUS"} > 0'),
            )
            assert float(unhealthy[0]["value"][1]) == ambiguous
            dead = prometheus.query("sum by (reason) (increase(reconciler_dead_letters_total[5m]))")
            assert any(float(s["value"][1]) > 0 for s in dead), dead

            # Every alert expression parses and evaluates on the server.
            for group in yaml.safe_load(RULES.read_text())["groups"]:
                for rule in group["rules"]:
                    prometheus.query(rule["expr"])
            # Every dashboard query returns at least one series. Lag is observed every few
            # seconds once positions exist, so it may first appear a scrape or two later.
            empty: list[str] = []

            def every_query_has_a_series() -> bool:
                empty[:] = [
                    target["expr"]
                    for panel in json.loads(DASHBOARD.read_text())["panels"]
                    for target in panel["targets"]
                    if not prometheus.query(_grafana(target["expr"]))
                ]
                return not empty

            deadline = time.monotonic() + 30
            while not every_query_has_a_series() and time.monotonic() < deadline:
                time.sleep(1)
            assert not empty, f"dashboard queries without a series after 30 s: {empty}"
    finally:
        server.shutdown()


def _grafana(expr: str) -> str:
    for variable, value in GRAFANA_VARS.items():
        expr = expr.replace(variable, value)
    return expr
