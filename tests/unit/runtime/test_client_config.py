"""After a broker restart: the producer keeps its broker handles, and both clients look for the
broker again at least once a second (see clients.py)."""

from __future__ import annotations

from pathlib import Path

from engine.runtime.clients import consumer_config, producer_config
from engine.settings import load_settings


def test_the_producer_never_re_bootstraps(tmp_path: Path) -> None:
    settings = load_settings(environ={}, state_dir=tmp_path)
    assert producer_config(settings)["metadata.recovery.strategy"] == "none"


def test_a_pass_through_cannot_turn_the_re_bootstrap_back_on(tmp_path: Path) -> None:
    settings = load_settings(
        environ={"RECONCILER_KAFKA__METADATA_RECOVERY_STRATEGY": "rebootstrap"},
        state_dir=tmp_path,
    )
    assert settings.kafka["metadata.recovery.strategy"] == "rebootstrap"  # it did pass through
    assert producer_config(settings)["metadata.recovery.strategy"] == "none"


def test_both_clients_retry_a_broker_that_is_away_at_least_once_a_second(tmp_path: Path) -> None:
    settings = load_settings(environ={}, state_dir=tmp_path)
    for config in (producer_config(settings), consumer_config(settings)):
        assert config["reconnect.backoff.max.ms"] <= 1_000


def test_the_producer_closes_idle_connections_within_the_send_offsets_cut(tmp_path: Path) -> None:
    """An idle close is the broker state change that ends librdkafka's wait on a retired group
    coordinator (clients.py): it must come before the watchdog cuts send_offsets (3 + 2 s)."""
    settings = load_settings(environ={}, state_dir=tmp_path)
    assert 0 < producer_config(settings)["connections.max.idle.ms"] <= 2_000
