"""Where a resume's time went: the engine's trace (engine/runtime/process/trace.py) joined with the
time the bench client read each decision.

Segments of one resume, wall clock ms, summing to its end-to-end latency:
- to_broker: from its produce (event time) to the broker's append (the bench sets the input
  topics to LogAppendTime): the bench producer's queue, the network, the broker;
- to_poll: from the append to the start of the consume call that returned it (being fetched,
  or fetched and waiting in librdkafka's queue while the loop was busy with an earlier batch);
- in_poll: inside that consume call (waiting for it to be fetched);
- order: in the event-time order buffer (ordering.py) until its batch began to fold;
- batch: from the batch's start to the end of its own fold (the records folded before it);
- to_commit: from its fold to the start of the commit (the rest of its batch, later batches);
- produce: steps 3-4, changelog produce and flush;
- commit: send offsets and commit the transaction;
- read: from the commit to the bench's read_committed consumer reading the decision.

The slowest 1% also get their means, which (unlike medians) sum to their mean end to end, and
the share of them folded ahead (while an overlapped commit ran; COMMIT_PROTOCOL.md, "Overlap").
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass
from pathlib import Path

SEGMENTS = (
    "to_broker",
    "to_poll",
    "in_poll",
    "order",
    "batch",
    "to_commit",
    "produce",
    "commit",
    "read",
)


@dataclass(frozen=True)
class Breakdown:
    """Per segment, the median over all traced resumes and the median and mean over the
    slowest 1%; the share of each folded ahead."""

    traced: int
    slowest: int
    everyone: dict[str, float]
    slow: dict[str, float]
    slow_total: float
    slow_mean: dict[str, float]
    ahead: tuple[float, float]  # all, slowest

    def table(self) -> str:
        head = "| resumes | " + " | ".join(SEGMENTS) + " | end to end | folded ahead |"
        rule = "|---" * (len(SEGMENTS) + 3) + "|"
        every = sum(self.everyone.values())
        rows = [
            f"| all {self.traced:,}, median ms | "
            + " | ".join(f"{self.everyone[s]:.1f}" for s in SEGMENTS)
            + f" | {every:.1f} | {self.ahead[0]:.0%} |",
            f"| slowest {self.slowest:,}, median ms | "
            + " | ".join(f"{self.slow[s]:.1f}" for s in SEGMENTS)
            + f" | {self.slow_total:.1f} | {self.ahead[1]:.0%} |",
            f"| slowest {self.slowest:,}, mean ms | "
            + " | ".join(f"{self.slow_mean[s]:.1f}" for s in SEGMENTS)
            + f" | {sum(self.slow_mean.values()):.1f} | |",
        ]
        return "\n".join([head, rule, *rows])


def segments(row: dict[str, str], read_at: float, event_time: float) -> dict[str, float]:
    t = {k: float(v) for k, v in row.items() if k not in ("session", "topic", "ahead")}
    polled = max(t["poll"], t["created"])
    return {
        "to_broker": t["created"] - event_time,
        "to_poll": polled - t["created"],
        "in_poll": t["consumed"] - polled,
        "order": t["released"] - t["consumed"],
        "batch": t["folded"] - t["released"],
        "to_commit": t["commit"] - t["folded"],
        "produce": t["flushed"] - t["commit"],
        "commit": t["committed"] - t["flushed"],
        "read": read_at - t["committed"],
    }


Row = dict[str, float]
Traced = tuple[Row, bool]  # a resume's segments, and whether it was folded ahead


def traced(path: Path, answers: dict[str, tuple[float, float]]) -> list[Traced]:
    """Each answered resume's segments, and whether it was folded ahead; `answers`: session
    -> (read at, event time) from the bench client."""
    if not path.exists():
        return []
    rows: list[Traced] = []
    with path.open(encoding="utf-8") as lines:
        for row in csv.DictReader(lines):
            answer = answers.get(row["session"])
            if answer is not None and row["topic"].endswith("resumes"):
                rows.append((segments(row, *answer), row.get("ahead") == "1"))
    return rows


def breakdown(path: Path, answers: dict[str, tuple[float, float]]) -> Breakdown | None:
    return summarize(traced(path, answers))


def summarize(found: list[Traced]) -> Breakdown | None:
    """Over all rows and over the slowest 1% (several runs' rows may be pooled)."""
    if not found:
        return None
    found = sorted(found, key=lambda r: sum(r[0].values()))
    rows = [r for r, _ in found]
    n_slow = max(1, len(rows) // 100)
    slow = rows[-n_slow:]

    def medians(of: list[Row]) -> dict[str, float]:
        return {s: statistics.median(r[s] for r in of) for s in SEGMENTS}

    def share(of: list[Traced]) -> float:
        return sum(ahead for _, ahead in of) / len(of)

    return Breakdown(
        traced=len(rows),
        slowest=len(slow),
        everyone=medians(rows),
        slow=medians(slow),
        slow_total=statistics.median(sum(r.values()) for r in slow),
        slow_mean={s: statistics.fmean(r[s] for r in slow) for s in SEGMENTS},
        ahead=(share(found), share(found[-n_slow:])),
    )
