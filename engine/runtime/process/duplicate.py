"""A second process with this process's `--instance-id`: found, said, and waited out.

Two processes with one instance id share the group's static membership (`group.instance.id`)
and the producer's `transactional.id`: each one's start fences the other, which rejoins and
fences back, so both abort and reassign in a loop while every input is still answered
exactly once. The crash of an instance and its successor's fencing look the same to the
fenced side, and they are normal; what tells the duplicate apart is that the other holder is
alive while this one is. Each engine names its incarnation (a random id per `Engine`) in its
consumer's `client.id`; before it rejoins after a fatal error, it asks the coordinator who
holds its `group.instance.id`. Its own closed consumer carries its own incarnation; a member
with another one is a live process started with the same id. Then the engine says so, once
per look, and waits with a growing pause instead of fencing it again; it rejoins when that
member is gone (stopped, or dead for the session timeout).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from engine.runtime.process.metrics import EngineMetrics
from engine.runtime.process.supervisor import Backoff
from engine.settings import Settings

log = logging.getLogger("reconciler.engine")
SEPARATOR = "#"  # client.id = <the configured client.id or "reconciler">#<incarnation>
LOOKUP_S = 5.0  # one describe of the group; a slow broker only delays the rejoin this long
WAIT_INITIAL_S, WAIT_MAX_S = 1.0, 30.0

Holders = Callable[[Settings, str, float], list[str]]
"""(settings, own incarnation, timeout) -> client ids of the other live holders of the id."""


def no_holders(settings: Settings, incarnation: str, timeout_s: float) -> list[str]:
    """`Holders` of clients that share no group with another process (injected test clients)."""
    return []


def new_incarnation() -> str:
    return uuid.uuid4().hex[:12]


def with_incarnation(settings: Settings, incarnation: str) -> Settings:
    """The settings whose clients name this incarnation in their `client.id`."""
    base = str(settings.kafka.get("client.id", "reconciler"))
    kafka = {**settings.kafka, "client.id": f"{base}{SEPARATOR}{incarnation}"}
    return settings.model_copy(update={"kafka": kafka})


def incarnation_of(client_id: str) -> str:
    return client_id.rpartition(SEPARATOR)[2]


def others(members: list[tuple[str | None, str]], instance_id: str, own: str) -> list[str]:
    """Client ids of the members holding `instance_id` that another incarnation runs."""
    return sorted(
        client_id
        for group_instance_id, client_id in members
        if group_instance_id == instance_id and incarnation_of(client_id) != own
    )


def other_holders(
    settings: Settings,
    incarnation: str,
    timeout_s: float,
    admin_client: Callable[[dict[str, Any]], Any] = AdminClient,
) -> list[str]:
    """The coordinator's members holding our instance id from another process; [] when the
    lookup fails (then the engine rejoins as it would without this check)."""
    admin = admin_client(settings.client_config())
    try:
        futures = admin.describe_consumer_groups([settings.group_id], request_timeout=timeout_s)
        group: Any = futures[settings.group_id].result(timeout=timeout_s)
        members = [(m.group_instance_id, m.client_id) for m in group.members]
    except (KafkaException, TimeoutError, OSError) as exc:
        log.info("group members not known (%s): rejoining without the duplicate check", exc)
        return []
    finally:
        del admin  # no close(): the last reference destroys its handle now
    return others(members, settings.instance_id, incarnation)


class DuplicateWatch:
    """Before each rejoin: while another live process holds our instance id, say so and wait
    (1 s doubling to 30 s, re-asking after each pause); the metrics and /readyz show it."""

    def __init__(
        self,
        settings: Settings,
        incarnation: str,
        metrics: EngineMetrics,
        pause: Callable[[float], None],
        holders: Holders = other_holders,
    ) -> None:
        self.settings, self.incarnation, self.metrics = settings, incarnation, metrics
        self.pause, self.holders = pause, holders
        self.backoff = Backoff(initial_s=WAIT_INITIAL_S, max_s=WAIT_MAX_S)
        self.waits = 0  # pauses in the current duplicate episode

    def wait_out(self, stopping: Callable[[], bool]) -> None:
        """Returns when no other process holds the id (or on stop)."""
        while not stopping():
            held_by = self.holders(self.settings, self.incarnation, LOOKUP_S)
            if not held_by:
                self._clear()
                return
            self.waits += 1
            delay = self.backoff.delay(self.waits)
            instance = self.settings.instance_id
            reason = (
                f"two processes run with --instance-id {instance} (this one's client.id ends"
                f" {SEPARATOR}{self.incarnation}, the other is {', '.join(held_by)}); stop one"
                " or give each its own id"
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
