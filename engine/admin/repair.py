"""`reconciler repair SESSION ...`: an operator repair command, and the engine's answer to it.

The command is published on the intents topic (keyed by session id, like every input) and the
engine's decision about it is awaited by its id.
"""

from __future__ import annotations

import getpass
import time
import uuid

from confluent_kafka import Producer

from engine.admin.explain import READ_TIMEOUT_S, session_decisions
from engine.core.events import Decision, RepairEvent, RepairResolution
from engine.errors import EngineError
from engine.settings import Settings
from engine.wire import Codec


class RepairNotAnsweredError(EngineError):
    """The engine did not answer a repair command in time."""


def repair(
    settings: Settings,
    session_id: str,
    resolution: RepairResolution,
    reason: str,
    actor: str | None = None,
    intent_id: str | None = None,
    wait_s: float = READ_TIMEOUT_S,
) -> Decision:
    """Publish the repair command and return the engine's decision about it."""
    codec = Codec()
    event = RepairEvent(
        event_id=f"repair-{uuid.uuid4()}",
        session_id=session_id,
        event_time_ms=int(time.time() * 1000),  # the operator's clock becomes event time
        resolution=resolution,
        actor=actor or getpass.getuser(),
        reason=reason,
        intent_id=intent_id,
    )
    producer = Producer(
        settings.client_config(
            **{"partitioner": "murmur2_random", "enable.idempotence": True, "acks": "all"}
        )
    )
    producer.produce(settings.topics.intents, key=session_id.encode(), value=codec.encode(event))
    if producer.flush(READ_TIMEOUT_S) != 0:
        raise EngineError(
            "the repair command was not acknowledged by the brokers.",
            "check the brokers and retry; nothing was repaired.",
        )
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        for decision in session_decisions(settings, session_id, codec):
            if decision.decision_id == event.event_id:
                return decision
        time.sleep(0.5)
    raise RepairNotAnsweredError(
        f"the engine did not answer repair {event.event_id} within {wait_s:.0f}s "
        "(the command is recorded on the intents topic and will be applied when it runs).",
        f"check that `reconciler run` is up, then `reconciler explain {session_id}`.",
    )
