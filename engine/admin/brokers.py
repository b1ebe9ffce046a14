"""Reaching the brokers from an operator command: quietly, within a deadline, or not at all.

An operator command must never print librdkafka's connection noise or wait a minute before it
says the brokers are down: every client built here logs into a silent logger, and `require_topics`
answers within ``timeout_s`` with the topics' partition counts or one `EngineError`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from engine.errors import KafkaUnavailableError, TopicLayoutError
from engine.settings import Settings

DEFAULT_TIMEOUT_S = 5.0
"""How long an operator command waits for the brokers before it gives up (``--timeout``)."""

_SILENT = logging.getLogger("reconciler.admin.librdkafka")
_SILENT.addHandler(logging.NullHandler())
_SILENT.propagate = False


def _ignore(_error: KafkaError) -> None:
    """Client-level errors surface as exceptions of the calls that hit them."""


def quiet_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """A client configuration whose librdkafka logs and error callbacks print nothing."""
    return settings.client_config(logger=_SILENT, error_cb=_ignore, **overrides)


def require_topics(
    settings: Settings, topics: Sequence[str], timeout_s: float = DEFAULT_TIMEOUT_S
) -> dict[str, int]:
    """The partition count of each of ``topics``; `KafkaUnavailableError` when the brokers do
    not answer within ``timeout_s``, `TopicLayoutError` when a topic is missing."""
    admin = AdminClient(quiet_config(settings))
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise KafkaUnavailableError(
            f"no answer from the brokers at {settings.bootstrap_servers} within {timeout_s:g} s "
            f"({exc.args[0].str() if exc.args else exc}).",
            "check --bootstrap-servers / RECONCILER_BOOTSTRAP_SERVERS and that Kafka is up.",
        ) from exc
    absent = [name for name in topics if name not in metadata.topics]
    if absent:
        raise TopicLayoutError(
            f"topics missing: {', '.join(absent)}.",
            "check --topic-prefix, or create them with `reconciler topics create`.",
        )
    return {name: len(metadata.topics[name].partitions) for name in topics}
