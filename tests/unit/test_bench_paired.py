"""tools/bench_paired.py without a broker or a build: its arguments, the rotating order of the
rounds and the ratios it prints."""

from __future__ import annotations

import pytest

from tools import bench_paired
from tools.bench_paired import Commit, Result, UsageError, parse_args, ratios, rotation, spread


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--commit", "HEAD"], "at least two --commit"),
        ([], "at least two --commit"),
        (["--commit", "HEAD", "--commit", "HEAD"], "each --commit once"),
        (
            ["--commit", "HEAD~1", "--commit", "HEAD", "--rounds", "0"],
            "--rounds must be at least 1",
        ),
        (["--commit", "HEAD~1", "--commit", "HEAD", "--warmup", "-1"], "--warmup must be 0"),
        (["--commit", "HEAD~1", "--commit", "HEAD", "--run-timeout", "5"], "--run-timeout"),
    ],
)
def test_a_bad_argument_is_refused_with_what_is_wrong(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_args(argv)


def test_the_defaults_are_the_bench_s_throughput_run() -> None:
    args = parse_args(["--commit", "HEAD~1", "--commit", "HEAD"])
    assert (args.rounds, args.warmup, args.sessions, args.partitions, args.commit_ms) == (
        5,
        1,
        20_000,
        6,
        100,
    )


def test_an_unknown_commit_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    code = bench_paired.main(["--commit", "HEAD", "--commit", "no-such-commit-anywhere"])
    assert code == 2
    err = capsys.readouterr().err
    assert "unknown commit 'no-such-commit-anywhere'" in err


def test_rounds_below_one_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_paired.main(["--commit", "HEAD~1", "--commit", "HEAD", "--rounds", "0"]) == 2
    assert "--rounds must be at least 1" in capsys.readouterr().err


def test_known_commits_resolve_to_full_hashes() -> None:
    head, parent = bench_paired.resolve_commits(["HEAD", "HEAD~1"])
    assert len(head.sha) == 40
    assert head.short == head.sha[:7]
    assert head.sha != parent.sha


def test_each_round_starts_one_commit_later_and_every_commit_leads_equally_often() -> None:
    labels = ["a", "b", "c"]
    orders = [rotation(labels, r) for r in range(6)]
    assert orders[:3] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert orders[3:] == orders[:3]
    assert all(sorted(o) == labels for o in orders)
    firsts = [o[0] for o in orders]
    lasts = [o[-1] for o in orders]
    assert {x: firsts.count(x) for x in labels} == {"a": 2, "b": 2, "c": 2}
    assert {x: lasts.count(x) for x in labels} == {"a": 2, "b": 2, "c": 2}


def test_ratios_are_taken_within_a_round_and_a_failed_run_leaves_a_gap() -> None:
    rounds: list[dict[str, Result | None]] = [
        {"old": Result(rate=10_000, cpu_us=50), "new": Result(rate=9_000, cpu_us=60)},
        {"old": Result(rate=12_000, cpu_us=40), "new": None},
        {"old": Result(rate=8_000, cpu_us=80), "new": Result(rate=10_000, cpu_us=60)},
    ]
    assert ratios(rounds, "old", "new") == [0.9, None, 1.25]
    assert ratios(rounds, "old", "new", cpu=True) == [1.2, None, 0.75]
    assert spread(ratios(rounds, "old", "new")) == "0.90 / 1.07 / 1.25"
    assert spread([None, None]) == "n/a"


def test_the_table_shows_each_round_its_ratios_and_their_spread() -> None:
    commits = [Commit("old", "1" * 40), Commit("new", "2" * 40)]
    rounds: list[dict[str, Result | None]] = [
        {"old": Result(rate=10_000, cpu_us=50), "new": Result(rate=9_500, cpu_us=55)},
        {"old": Result(rate=10_000, cpu_us=50), "new": None},
    ]
    lines = bench_paired.table(commits, rounds)
    assert lines[0] == "| inputs/s: round | old | new | new / old |"
    assert lines[2] == "| 1 | 10,000 | 9,500 | 0.95 |"
    assert lines[3] == "| 2 | 10,000 | failed | failed |"
    assert lines[4] == "| min / median / max |  |  | 0.95 / 0.95 / 0.95 |"
    cpu = lines.index("| engine CPU us/input: round | old | new | new / old |")
    assert lines[cpu + 2] == "| 1 | 50 | 55 | 1.10 |"
