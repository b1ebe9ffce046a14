"""The operator commands against a running engine: demo table, explain and repair."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from engine.admin.explain import explain
from engine.admin.repair import repair
from engine.cli import main
from engine.core.events import AckOutcome, Event, RepairResolution, Verdict
from engine.demo import run_embedded
from engine.settings import load_settings
from tests.integration.engine_harness import engine_settings, engine_thread, produce, read_decisions
from tests.integration.exactly_once import OUT, C, U
from tests.unit.core.builders import ack, d, intent, msg, record, resume

pytestmark = pytest.mark.kafka


def _topic_names(bootstrap: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics)


def test_demo_table_shows_the_key_cases_and_removes_its_topics(kafka_bootstrap: str) -> None:
    before = _topic_names(kafka_bootstrap)
    table = run_embedded(load_settings(environ={}, bootstrap_servers=kafka_bootstrap))
    left = {name for name in _topic_names(kafka_bootstrap) - before if name.startswith("demo-")}
    assert left == set()
    rows = {tuple(line.split()[:1] + line.split()[-4:-2]) for line in table.splitlines()[1:]}
    assert ("lost-ack", "CONTINUE", "COMMITTED") in rows
    assert ("atomic-failure", "APPEND_ONCE", "UNCHANGED") in rows
    assert ("ambiguous", "WITHHELD", "AMBIGUOUS") in rows
    assert ("two-copies", "WITHHELD", "HELD_BY_OTHER") in rows
    assert ("repaired", "APPEND_ONCE", "ACCEPTED_ABSENT") in rows


def test_repair_then_explain(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = engine_settings(kafka_bootstrap, unique_name, tmp_path / "state")
    sid = "s1"  # the builders' session
    events: list[Event] = [
        intent("e1", [OUT], [U, C]),
        ack("e2", AckOutcome.UNKNOWN),
        resume("e3", record([OUT], [U, C]), [U, C, msg("foreign")]),
    ]
    with engine_thread(settings):
        produce(kafka_bootstrap, settings, events)
        read_decisions(kafka_bootstrap, settings, until=3, idle_s=1)
        ambiguous = explain(settings, sid)
        decision = repair(
            settings,
            sid,
            RepairResolution.ACCEPT_COMMITTED,
            "verified by hand",
            actor="ops@example",
            intent_id="i1",
        )
        assert decision.verdict is Verdict.RECORDED
        text = explain(settings, sid)
        code = main(
            [
                "explain",
                sid,
                "--bootstrap-servers",
                kafka_bootstrap,
                "--topic-prefix",
                settings.topic_prefix,
                "--partitions",
                "3",
            ]
        )
    assert code == 0
    assert capsys.readouterr().out.strip() == text
    assert "WITHHELD AMBIGUOUS" in text
    assert "RECORDED REPAIRED" in text
    assert "ops@example" in text or "verified by hand" in text
    assert "now: health=CLEAR" in text
    # Before the repair, explain printed the digests the operator is asked to compare.
    assert "    before: " + " ".join(d([U, C])) in ambiguous
    assert f"    batch:  {d([OUT])[0]} function_call_output call_id=charge-1" in ambiguous


def test_explain_and_repair_name_missing_topics_with_exit_1(
    kafka_bootstrap: str, unique_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--bootstrap-servers", kafka_bootstrap, "--topic-prefix", f"{unique_name}."]
    assert main(["explain", "s1", *common]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"reconciler: topics missing: {unique_name}.decisions")
    assert "reconciler topics create" in err
    repair_args = ["--resolution", "ABANDON", "--reason", "r", "--actor", "ops"]
    assert main(["repair", "s1", *repair_args, *common]) == 1
    assert f"topics missing: {unique_name}.intents" in capsys.readouterr().err
