"""A second process with this process's `--instance-id`: found, said, and waited out.

Two processes with one instance id share the group's static membership (`group.instance.id`)
and the producer's `transactional.id`: each one's start fences the other, which rejoins and
fences back, so both abort and reassign in a loop while every input is still answered
exactly once. The crash of an instance and its successor's fencing look the same to the
fenced side, and they are normal; what tells the duplicate apart is that the other holder is
alive while this one is.

The coordinator keeps one member per `group.instance.id`. A join under the id replaces that
member's member id and keeps the rest: its `client.id` and host stay those of the process that
first joined under the id (Kafka's `ClassicGroup.replaceStaticMember`), so they name no
process. A member that stops heartbeating (a killed process, or a closed static consumer,
which does not leave) stays listed until its session times out. So the engine keeps the
member ids its own consumers were given (`Joined`: at each assignment, and before each close),
and before it rejoins after a fatal error it asks the coordinator who holds its
`group.instance.id`. One of its own member ids: nobody else joined since. Another member id,
once this process has joined: a process joined after it, so one that was alive after this one
started (a predecessor killed before that cannot join). Then the engine says so, once per
look, and waits with a growing pause instead of fencing it again; it rejoins when that member
is gone (stopped, or dead for the session timeout). Before this process's first join the
listed member may be its dead predecessor's, which the join replaces, so nothing is said: a
live twin is then fenced by that join, and it is the one that finds and names this process.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Collection
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from engine.runtime.process.metrics import EngineMetrics
from engine.runtime.process.supervisor import Backoff
from engine.settings import Settings

log = logging.getLogger("reconciler.engine")
LOOKUP_S = 5.0  # one describe of the group; a slow broker only delays the rejoin this long
WAIT_INITIAL_S, WAIT_MAX_S = 1.0, 30.0
JOINS_KEPT = 8
"""Member ids of this process's last joins kept: the group lists at most the newest one that
reached the coordinator (an older one of ours is replaced by it, or expired)."""

Holders = Callable[[Settings, Collection[str], float], list[str]]
"""(settings, the member ids this process joined as, timeout) -> the member ids of the members
holding our instance id that none of our consumers joined as."""


def no_holders(settings: Settings, own: Collection[str], timeout_s: float) -> list[str]:
    """`Holders` of clients that share no group with another process (injected test clients)."""
    return []


class Joined:
    """The member ids the coordinator gave this process's consumers, newest last."""

    def __init__(self) -> None:
        self.member_ids: deque[str] = deque(maxlen=JOINS_KEPT)

    def note(self, consumer: Any) -> None:
        """Keeps the consumer's current member id (none before its join completes)."""
        try:
            member_id = consumer.memberid()
        except (RuntimeError, KafkaException):  # closed: it had been noted before
            return
        if member_id and member_id not in self.member_ids:
            self.member_ids.append(member_id)

    def __bool__(self) -> bool:
        return bool(self.member_ids)

    @property
    def latest(self) -> str:
        return self.member_ids[-1] if self.member_ids else ""


def others(
    members: list[tuple[str | None, str]], instance_id: str, own: Collection[str]
) -> list[str]:
    """Member ids of the members holding `instance_id` (from (group.instance.id, member id)
    pairs) that none of our consumers joined as."""
    return sorted(
        member_id
        for group_instance_id, member_id in members
        if group_instance_id == instance_id and member_id not in own
    )


def other_holders(
    settings: Settings,
    own: Collection[str],
    timeout_s: float,
    admin_client: Callable[[dict[str, Any]], Any] = AdminClient,
) -> list[str]:
    """The coordinator's members holding our instance id under a member id none of our
    consumers joined as; [] when the lookup fails (then the engine rejoins as it would
    without this check)."""
    admin = admin_client(settings.client_config())
    try:
        futures = admin.describe_consumer_groups([settings.group_id], request_timeout=timeout_s)
        group: Any = futures[settings.group_id].result(timeout=timeout_s)
        members = [(m.group_instance_id, m.member_id) for m in group.members]
    except (KafkaException, TimeoutError, OSError) as exc:
        log.info("group members not known (%s): rejoining without the duplicate check", exc)
        return []
    finally:
        del admin  # no close(): the last reference destroys its handle now
    return others(members, settings.instance_id, own)


class DuplicateWatch:
    """Before each rejoin: while another live process holds our instance id, say so and wait
    (1 s doubling to 30 s, re-asking after each pause); the metrics and /readyz show it."""

    def __init__(
        self,
        settings: Settings,
        joined: Joined,
        metrics: EngineMetrics,
        pause: Callable[[float], None],
        holders: Holders = other_holders,
    ) -> None:
        self.settings, self.joined, self.metrics = settings, joined, metrics
        self.pause, self.holders = pause, holders
        self.backoff = Backoff(initial_s=WAIT_INITIAL_S, max_s=WAIT_MAX_S)
        self.waits = 0  # pauses in the current duplicate episode

    def wait_out(self, stopping: Callable[[], bool]) -> None:
        """Returns when no other process holds the id (or on stop), at once before this
        process's first join (a member listed then may be its dead predecessor's)."""
        if not self.joined:
            return
        while not stopping():
            held_by = self.holders(self.settings, tuple(self.joined.member_ids), LOOKUP_S)
            if not held_by:
                self._clear()
                return
            self.waits += 1
            delay = self.backoff.delay(self.waits)
            instance = self.settings.instance_id
            reason = (
                f"two processes run with --instance-id {instance} (another one joined after"
                f" this one's join as {self.joined.latest}: the group's member is now"
                f" {', '.join(held_by)}); stop one or give each its own id"
            )
            log.error("duplicate instance id: %s; not rejoining for %.0fs", reason, delay)
            self.metrics.duplicate_instance.set(1)
            self.metrics.duplicate_detections.inc()
            self.metrics.unready_reason = f"duplicate instance id: {reason}"
            self.metrics.set_ready(False)
            self.pause(delay)

    def _clear(self) -> None:
        if self.waits:
            log.warning(
                "no other process holds --instance-id %s now: rejoining",
                self.settings.instance_id,
            )
        self.waits = 0
        self.metrics.duplicate_instance.set(0)
        self.metrics.unready_reason = ""
