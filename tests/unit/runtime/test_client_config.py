"""The producer keeps its broker handles when every broker is down (see clients.py)."""

from __future__ import annotations

from pathlib import Path

from engine.runtime.clients import producer_config
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
