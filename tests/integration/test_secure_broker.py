"""The engine and the runners on a broker with SASL/SCRAM-SHA-512 and ACLs
(`tools/kafka_local.py start --secure`): a runner cannot forge a decision or read engine
state, and the engine, configured the way the chart configures it (credentials from a Secret),
decides end to end under SASL."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from msgspec.structs import replace

from engine.admin.topics import create_topics
from engine.core.events import AckOutcome, Decision, Event, Reason, Verdict
from engine.settings import Settings, load_settings
from engine.wire import RecordType
from tests.helm_render import engine_env, render
from tests.integration.engine_harness import CODEC, engine_thread
from tests.unit.core.builders import ack, call, intent, msg, out, record, resume
from tools import kafka_local, kafka_secure

pytestmark = pytest.mark.kafka

INSTANCE = "pytest-secure"


@dataclass(frozen=True)
class SecureBroker:
    bootstrap: str
    home: Path

    def config(self, user: str) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap, **kafka_secure.client_config(self.home, user)}


@pytest.fixture(scope="module")
def secure_broker() -> Iterator[SecureBroker]:
    """A second broker of its own (its listener and authorizer differ from the shared one)."""
    try:
        info = kafka_local.start(INSTANCE, fresh=True, secure=True)
    except kafka_local.SetupError as exc:
        pytest.fail(f"could not start the secure broker: {exc}")
    try:
        yield SecureBroker(info.bootstrap, kafka_local.instance_dir(INSTANCE))
    finally:
        kafka_local.stop(INSTANCE)


@pytest.fixture
def prefix(secure_broker: SecureBroker, unique_name: str) -> str:
    """Topics made by `admin`, with the engine's and runner's ACLs for them."""
    admin = kafka_secure.client_config(secure_broker.home, "admin")
    admin_settings = Settings(
        bootstrap_servers=secure_broker.bootstrap,
        topic_prefix=f"{unique_name}.",
        partitions=2,
        kafka=admin,
    )
    create_topics(admin_settings)
    kafka_secure.create_acls(
        secure_broker.home, secure_broker.bootstrap, f"{unique_name}.", f"{unique_name}-engine"
    )
    return unique_name


def produce_as(broker: SecureBroker, user: str, topic: str, value: bytes) -> KafkaError | None:
    """Send one record; the delivery error, or None when the broker took it."""
    outcome: list[KafkaError | None] = []
    producer = Producer({**broker.config(user), "message.timeout.ms": 15_000})
    producer.produce(topic, key=b"s1", value=value, on_delivery=lambda err, _m: outcome.append(err))
    producer.flush(20)
    assert outcome, "no delivery report within 20 s"
    return outcome[0]


def first_fetch(broker: SecureBroker, user: str, topic: str) -> KafkaError | None:
    """Subscribe and read from the start: the consumer error, or None once a record was read."""
    consumer = Consumer(
        {
            **broker.config(user),
            "group.id": f"{kafka_secure.RUNNER_GROUP_PREFIX}probe",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is None:
                return None
            if error.code() != KafkaError._PARTITION_EOF:
                return error
        raise AssertionError(f"neither a record nor an error from {topic} within 30 s")
    finally:
        consumer.close()


def test_runner_cannot_produce_to_decisions(secure_broker: SecureBroker, prefix: str) -> None:
    assert produce_as(secure_broker, "runner", f"{prefix}.intents", b"x") is None  # control
    forged = produce_as(secure_broker, "runner", f"{prefix}.decisions", b"forged grant")
    assert forged is not None
    assert forged.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_runner_cannot_read_changelog(secure_broker: SecureBroker, prefix: str) -> None:
    # Records on both topics, written by the engine principal, so only the ACL differs.
    for topic in ("changelog", "decisions"):
        assert produce_as(secure_broker, "engine", f"{prefix}.{topic}", b"r") is None
    assert first_fetch(secure_broker, "runner", f"{prefix}.decisions") is None  # control
    denied = first_fetch(secure_broker, "runner", f"{prefix}.changelog")
    assert denied is not None
    assert denied.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_a_wrong_password_cannot_log_in(secure_broker: SecureBroker, prefix: str) -> None:
    errors: list[KafkaError] = []
    config = {**secure_broker.config("runner"), "sasl.password": "wrong"}
    producer = Producer({**config, "error_cb": errors.append})
    deadline = time.monotonic() + 20
    while not errors and time.monotonic() < deadline:
        producer.poll(0.2)
    assert errors, "no error reported within 20 s"
    assert errors[0].code() == KafkaError._AUTHENTICATION


U, C, OUT = msg("charge 7"), call("charge-1"), out("charge-1")


def test_engine_decides_under_sasl_with_chart_credentials(
    secure_broker: SecureBroker, prefix: str, tmp_path: Path
) -> None:
    # The engine's settings are exactly the environment the chart renders, with the SASL
    # username and password resolved from the Secret the release names.
    password = kafka_secure.read_credentials(secure_broker.home)["engine"]
    manifests = render(
        "--set",
        f"bootstrapServers={secure_broker.bootstrap}",
        "--set",
        f"topicPrefix={prefix}.",
        "--set",
        f"groupId={prefix}-engine",
        "--set",
        "partitions=2",
        "--set",
        "replicaCount=1",
        "--set",
        "sasl.enabled=true",
        "--set",
        "sasl.existingSecret=engine-kafka",
        "--set",
        "sasl.securityProtocol=SASL_PLAINTEXT",
    )
    secret = {"engine-kafka": {"username": "engine", "password": password}}
    env = engine_env(manifests, secret)
    assert "RECONCILER_KAFKA__SASL_PASSWORD" in env
    settings = load_settings(
        environ=env,
        state_dir=tmp_path,
        metrics_port=0,
        commit_interval_ms=100,
        transaction_timeout_ms=10_000,
        session_timeout_ms=6_000,
    )
    assert settings.kafka["sasl.username"] == "engine"

    sid = f"{prefix}-s"
    events: list[Event] = [
        replace(e, session_id=sid, event_id=f"{sid}/{e.event_id}")
        for e in (
            intent("e1", [OUT], [U, C]),
            ack("e2", AckOutcome.UNKNOWN),
            resume("e3", record([OUT], [U, C]), [U, C, OUT]),
        )
    ]
    with engine_thread(settings):
        producer = Producer({**secure_broker.config("runner"), "partitioner": "murmur2_random"})
        for event in events:
            topic = settings.topics.topic_for(event)
            producer.produce(topic, key=sid.encode(), value=CODEC.encode(event))
        assert producer.flush(30) == 0
        decision = read_decision(secure_broker, settings.topics.decisions, f"{sid}/e3")
    assert decision.verdict is Verdict.CONTINUE
    assert decision.reason is Reason.COMMITTED


def read_decision(broker: SecureBroker, topic: str, decision_id: str) -> Decision:
    """Read decisions as the runner principal until the final one answering `decision_id`."""
    consumer = Consumer(
        {
            **broker.config("runner"),
            "group.id": f"{kafka_secure.RUNNER_GROUP_PREFIX}reader",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            decision = CODEC.decode(RecordType.DECISION, message.value() or b"")
            assert isinstance(decision, Decision)
            # A resume read before its intent is parked (DEFERRED) and answered again later.
            answers = decision.decision_id in (decision_id, f"{decision_id}/final")
            if answers and decision.verdict is not Verdict.DEFERRED:
                return decision
        raise AssertionError(f"no decision for {decision_id} within 90 s")
    finally:
        consumer.close()
