"""`reconciler replay --verify` on the frozen corpus, and on corpora altered to differ."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from engine.admin.replay import ReplayDifferenceError, Step, read_steps, verify, write_steps
from engine.cli import main
from engine.core.events import Reason, Verdict
from tests.unit.core.test_final_flag import REPLACED_PAIRS, check_final_flags
from tools.gen_replay_corpus import CORPUS, generate

CORPUS_LINES = CORPUS.read_text("utf-8").splitlines()


def test_the_frozen_corpus_replays_identically() -> None:
    outcome = verify(read_steps(CORPUS))
    assert outcome.inputs > 1_000
    assert outcome.steps > outcome.inputs
    assert outcome.decisions == sum(len(json.loads(line)["decisions"]) for line in CORPUS_LINES)


def test_the_generator_writes_exactly_the_frozen_corpus(tmp_path: Path) -> None:
    fresh = tmp_path / "corpus.jsonl"
    write_steps(fresh, generate())
    assert fresh.read_text("utf-8").splitlines() == CORPUS_LINES, (
        "the core's answers changed: say which and why, then run "
        "`python -m tools.gen_replay_corpus` in the same commit (tests/fixtures/replay/README.md)"
    )


def test_final_matches_spec_for_every_verdict_and_reason_in_the_corpus() -> None:
    """SPEC.md §4's `final`, per session of the corpus, for every pair the corpus holds."""
    by_session: dict[str, list[Step]] = defaultdict(list)
    for step in read_steps(CORPUS):
        by_session[step.session_id].append(step)
    pairs: dict[tuple[Verdict, Reason], set[bool]] = defaultdict(set)
    for steps in by_session.values():
        for pair, flags in check_final_flags([d for s in steps for d in s.decisions]).items():
            pairs[pair] |= flags
    replaced = {pair for pair, flags in pairs.items() if False in flags}
    assert replaced == REPLACED_PAIRS
    assert all(pairs[pair] == {False} for pair in REPLACED_PAIRS)
    assert len(pairs) >= 40, sorted(pairs)


def _altered(tmp_path: Path, line: int, change: dict[str, object]) -> Path:
    lines = list(CORPUS_LINES)
    record = json.loads(lines[line])
    record["decisions"][0].update(change)
    lines[line] = json.dumps(record)
    path = tmp_path / "altered.jsonl"
    path.write_text("\n".join(lines) + "\n", "utf-8")
    return path


def _first_parked_line() -> int:
    return next(
        n
        for n, line in enumerate(CORPUS_LINES)
        if json.loads(line)["decisions"] and json.loads(line)["decisions"][0]["reason"] == "PARKED"
    )


def test_a_changed_answer_is_the_first_difference_with_its_ids(tmp_path: Path) -> None:
    n = _first_parked_line()
    record = json.loads(CORPUS_LINES[n])
    path = _altered(tmp_path, n, {"final": True})  # what the engine published before
    with pytest.raises(ReplayDifferenceError) as caught:
        verify(read_steps(path))
    text = str(caught.value)
    event_id = record["input"]["value"]["event_id"]
    assert f"at {record['source']} (session {record['session_id']}, input {event_id})" in text
    assert "differs in final: published" in text
    assert f"{event_id} RECORDED PARKED (final=true)" in text
    assert f"the current core gives {event_id} RECORDED PARKED (final=false)" in text


def test_a_missing_or_extra_decision_is_a_difference(tmp_path: Path) -> None:
    lines = list(CORPUS_LINES)
    n = _first_parked_line()
    record = json.loads(lines[n])
    record["decisions"].append(record["decisions"][0])
    lines[n] = json.dumps(record)
    path = tmp_path / "extra.jsonl"
    path.write_text("\n".join(lines) + "\n", "utf-8")
    with pytest.raises(ReplayDifferenceError, match=r"2 decision\(s\) published, the current"):
        verify(read_steps(path))
    record["decisions"] = []
    lines[n] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n", "utf-8")
    with pytest.raises(ReplayDifferenceError, match=r"also gives .* RECORDED PARKED"):
        verify(read_steps(path))


def test_the_command_exits_0_identical_1_at_a_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", "--verify", "--inputs", str(CORPUS)]) == 0
    assert "all identical" in capsys.readouterr().out
    path = _altered(tmp_path, _first_parked_line(), {"verdict": "REJECTED"})
    assert main(["replay", "--verify", "--inputs", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("reconciler: at reconciler.")
    assert "differs in verdict" in err
    assert "Fix: if the core's answers changed on purpose" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["replay", "--inputs", "x.jsonl"], "the following arguments are required: --verify"),
        (["replay", "--verify", "--partition", "-1"], "a partition number is 0 or more"),
        (["replay", "--verify", "--partition", "one"], "not a partition number: 'one'"),
        (["replay", "--verify", "--inputs", "c.jsonl", "--partition", "0"], "not both"),
        (["replay", "--verify", "--inputs", "/nonexistent/c.jsonl"], "cannot read"),
    ],
)
def test_bad_arguments_say_why_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(argv)
    except SystemExit as exited:  # argparse's own refusals
        code = int(exited.code or 0)
    assert code == 2
    assert message in capsys.readouterr().err


def test_a_malformed_line_names_its_number_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(CORPUS_LINES[0] + '\n{"source": "x"}\n', "utf-8")
    assert main(["replay", "--verify", "--inputs", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}, line 2: not a replay step (KeyError" in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe not text\n", "is not UTF-8 text (byte 0)"),
        (b"", "holds no replay step"),
        (b"\n  \n", "holds no replay step"),
    ],
)
def test_a_file_not_utf8_or_without_steps_exits_2_with_a_message(
    content: bytes, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(content)
    assert main(["replay", "--verify", "--inputs", str(path)]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert "all identical" not in captured.out


def test_the_timeout_bounds_each_read_as_an_idle_deadline(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--timeout reaches every read of the topics, as a deadline for the next record; --help
    says so. (The reads themselves run against Kafka in tests/integration.)"""
    import engine.admin.replay_topics as replay_topics

    reads: list[tuple[str, float, bool]] = []

    def no_records(
        _settings: object, topic: str, _partition: int, timeout_s: float, *, idle: bool = False
    ) -> list[object]:
        reads.append((topic, timeout_s, idle))
        return []

    monkeypatch.setattr(replay_topics, "partitions_to_replay", lambda *_: ([0], 1))
    monkeypatch.setattr(replay_topics, "require_whole_history", lambda *_: None)
    monkeypatch.setattr(replay_topics, "read_partition", no_records)
    assert main(["replay", "--verify", "--topic-prefix", "t.", "--timeout", "7"]) == 0
    assert reads == [("t.decisions", 7.0, True)]
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    assert "no new record for" in " ".join(capsys.readouterr().out.split())
