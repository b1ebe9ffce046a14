"""Settings precedence, secret redaction, and CLI exits on bad input (no broker needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.cli import main
from engine.errors import ConfigError
from engine.settings import Settings, load_settings, settings_env


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    config = tmp_path / "engine.toml"
    config.write_text(
        'partitions = 4\ntopic_prefix = "file."\n[kafka]\n"security.protocol" = "SSL"\n'
    )
    env = {"RECONCILER_TOPIC_PREFIX": "env.", "RECONCILER_KAFKA__SASL_PASSWORD": "hunter2"}
    settings = load_settings(config, env, partitions=8)
    assert settings.partitions == 8
    assert settings.topic_prefix == "env."
    assert settings.topics.changelog == "env.changelog"
    assert settings.client_config()["security.protocol"] == "SSL"
    assert settings.client_config()["sasl.password"] == "hunter2"
    assert settings.redacted()["kafka"]["sasl.password"] == "***"
    assert "hunter2" not in repr(settings.redacted())


def test_nested_kafka_tables_flatten_and_secrets_never_show(tmp_path: Path) -> None:
    config = tmp_path / "engine.toml"
    config.write_text(
        '[kafka]\nsasl.mechanism = "PLAIN"\nsasl.password = "hunter2"\n'
        'sasl.oauthbearer.config = "clientSecret=s3cr3t"\n'
        "enable.ssl.certificate.verification = true\n"
    )
    settings = load_settings(config, {})
    assert settings.client_config()["sasl.password"] == "hunter2"
    assert settings.client_config()["sasl.mechanism"] == "PLAIN"
    assert settings.client_config()["enable.ssl.certificate.verification"] == "true"
    shown = repr(settings.redacted())
    assert "hunter2" not in shown
    assert "s3cr3t" not in shown
    assert "PLAIN" in shown


def test_invalid_values_name_the_field() -> None:
    with pytest.raises(ConfigError, match="partitions"):
        load_settings(None, {"RECONCILER_PARTITIONS": "zero"})
    with pytest.raises(ConfigError, match="topic_prefix"):
        load_settings(None, {"RECONCILER_TOPIC_PREFIX": "bad prefix!"})


def test_a_transaction_timeout_too_close_to_the_commit_interval_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"set transaction_timeout_ms to 65000 or more"):
        load_settings(None, {}, commit_interval_ms=60_000)
    with pytest.raises(ConfigError, match=r"commit_interval_ms \(5001\) \+ 5000"):
        load_settings(None, {}, commit_interval_ms=5_001, transaction_timeout_ms=10_000)
    settings = load_settings(None, {}, commit_interval_ms=5_000, transaction_timeout_ms=10_000)
    assert settings.transaction_timeout_ms - settings.commit_interval_ms == 5_000


def test_unknown_setting_in_file_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "engine.toml"
    config.write_text("partitoins = 3\n")
    with pytest.raises(ConfigError, match="partitoins"):
        load_settings(config, {})


def test_cli_bad_argument_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["topics", "create", "--partitions", "many"])
    assert exit_info.value.code == 2
    assert "invalid int value" in capsys.readouterr().err


def test_cli_bad_setting_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topics", "verify", "--partitions", "0"]) == 2
    assert "partitions" in capsys.readouterr().err


def test_cli_missing_config_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["topics", "verify", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "cannot read settings file" in capsys.readouterr().err


def test_each_of_n_processes_gets_its_own_instance_state_dir_and_port(tmp_path: Path) -> None:
    from engine.cli import _child_command, _run_settings, build_parser

    argv = ["run", "--processes", "2", "--state-dir", str(tmp_path), "--metrics-port", "9500"]
    args = build_parser().parse_args(argv)
    settings = _run_settings(args)
    commands = [_child_command(args, settings, n) for n in range(settings.processes)]
    for n, command in enumerate(commands):
        flags = dict(zip(command[5::2], command[6::2], strict=True))
        assert command[3:5] == ["run", "--child"]
        assert flags["--instance-id"] == f"engine-0-{n}"
        assert flags["--state-dir"] == str(tmp_path / f"process-{n}")
        assert flags["--metrics-port"] == str(9500 + n)
    one = build_parser().parse_args(["run", "--state-dir", str(tmp_path)])
    assert _child_command(one, _run_settings(one), 0)[5:] == ["--state-dir", str(tmp_path)]


def test_processes_must_be_at_least_one() -> None:
    with pytest.raises(ConfigError, match="processes"):
        load_settings(environ={"RECONCILER_PROCESSES": "0"})


def test_settings_env_gives_load_settings_every_field_back() -> None:
    settings = load_settings(
        environ={},
        topic_prefix="env.",
        partitions=4,
        state_dir=Path("/tmp/elsewhere"),
        commit_overlap=False,
        watchdog_margin_s=7.5,
        log_format="json",
        schema_registry_url="http://registry:8081",
        processes=3,
    ).model_copy(update={"kafka": {"sasl.mechanism": "PLAIN", "socket.timeout.ms": "5000"}})
    env = settings_env(settings)
    assert load_settings(None, env) == settings
    assert env["RECONCILER_COMMIT_OVERLAP"] == "false"
    assert env["RECONCILER_KAFKA__SASL_MECHANISM"] == "PLAIN"
    assert "RECONCILER_LATENCY_TRACE_PATH" not in env  # None: left at its default
    fields = {name for name in Settings.model_fields if name != "kafka"}
    assert {f"RECONCILER_{name.upper()}" for name in fields} - set(env) == {
        "RECONCILER_LATENCY_TRACE_PATH",
        "RECONCILER_REPLICATION_FACTOR",  # None: the cluster's default.replication.factor
    }


def test_settings_env_refuses_a_kafka_key_it_cannot_write() -> None:
    settings = load_settings(environ={}).model_copy(update={"kafka": {"odd_key": "1"}})
    with pytest.raises(ConfigError, match="odd_key"):
        settings_env(settings)
