"""`reconciler repair SESSION ...`: an operator repair command, and the engine's answer to it.

The command goes out through the runner client's `submit` (keyed by session id, murmur2, acks=all)
which positions on the session's decisions partition first and awaits the decision by id, the
same path a runner's resume takes.
"""

from __future__ import annotations

import getpass
import time
import uuid

from consumers.client import ReconcilerClient
from consumers.errors import ReconcilerClientError
from engine.admin.brokers import DEFAULT_TIMEOUT_S, quiet_config, require_topics
from engine.core.events import Decision, RepairEvent, RepairResolution
from engine.errors import EngineError
from engine.settings import Settings

ANSWER_TIMEOUT_S = 30.0
"""How long `repair` waits for the engine's answer once the command is durable."""


class RepairNotAnsweredError(EngineError):
    """The engine did not answer a repair command in time."""


def repair(
    settings: Settings,
    session_id: str,
    resolution: RepairResolution,
    reason: str,
    actor: str | None = None,
    intent_id: str | None = None,
    wait_s: float = ANSWER_TIMEOUT_S,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Decision:
    """Publish the repair command and return the engine's decision about it.

    Fails within ``timeout_s`` (nothing published) when the brokers do not answer or the topics
    are missing; `RepairNotAnsweredError` when the engine does not answer within ``wait_s``.
    """
    topics = settings.topics
    require_topics(settings, [topics.intents, topics.decisions], timeout_s)
    operator = actor or getpass.getuser()
    event = RepairEvent(
        event_id=f"repair-{uuid.uuid4()}",
        session_id=session_id,
        event_time_ms=int(time.time() * 1000),  # the operator's clock becomes event time
        resolution=resolution,
        actor=operator,
        reason=reason,
        intent_id=intent_id,
    )
    client = ReconcilerClient(
        settings.bootstrap_servers,
        runner_id=f"operator-{operator}",
        topic_prefix=settings.topic_prefix,
        kafka_config={k: v for k, v in quiet_config(settings).items() if k != "bootstrap.servers"},
        delivery_timeout_s=timeout_s,
    )
    try:
        decision = client.submit(event, timeout_s=wait_s)
    except ReconcilerClientError as exc:
        raise EngineError(
            exc.cause,
            f"check the brokers, then `reconciler explain {session_id}` before retrying "
            "(the command may have been recorded).",
        ) from exc
    finally:
        client.close()
    if decision is None:
        raise RepairNotAnsweredError(
            f"the engine did not answer repair {event.event_id} within {wait_s:g} s "
            "(the command is recorded on the intents topic and will be decided when it runs).",
            f"check that `reconciler run` is up, then `reconciler explain {session_id}`.",
        )
    return decision
