"""Typed settings for the engine and its commands: defaults, then a TOML file, then environment.

Environment variables are `RECONCILER_<FIELD>` in upper case (e.g. `RECONCILER_BOOTSTRAP_SERVERS`,
`RECONCILER_TOPIC_PREFIX`). librdkafka settings pass through untouched from the `[kafka]` table of
the file or from `RECONCILER_KAFKA__<KEY>` variables (dots written as `_`, e.g.
`RECONCILER_KAFKA__SASL_MECHANISM=PLAIN`), so SASL/SSL work without code changes. Secrets are
never printed: `Settings.redacted()` is what logs see.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from engine.errors import ConfigError
from engine.wire.topics import DEFAULT_PREFIX, TopicNames

ENV_PREFIX = "RECONCILER_"
KAFKA_ENV_PREFIX = "RECONCILER_KAFKA__"
# librdkafka settings whose values are secrets: passwords, keys, tokens, sasl.jaas.config,
# sasl.oauthbearer.config (it carries client secrets).
_SECRET_MARKERS = ("password", "secret", "token", "key", "config", "jaas", "credential")
# How much longer than the commit interval the broker must let a transaction stay open: steps
# 3-5 take tens of ms, but seconds when they retry across a broker restart or leader change, and
# a backlog fills the interval to the last ms. Less, and a busy transaction is aborted by the
# broker, the producer fenced and the engine rejoins in a loop.
TXN_TIMEOUT_MARGIN_MS = 5_000


class Settings(BaseModel):
    """Everything the engine and the CLI need; validated once at start."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap_servers: str = "127.0.0.1:9092"
    topic_prefix: str = Field(default=DEFAULT_PREFIX, pattern=r"^[A-Za-z0-9._-]*$")
    partitions: int = Field(default=6, ge=1, le=10_000)
    # Of the topics `reconciler topics create` makes. None: the cluster's
    # default.replication.factor. 1 on a cluster of several brokers is refused unless forced.
    replication_factor: int | None = Field(default=None, ge=1, le=10)
    group_id: str = "reconciler-engine"
    instance_id: str = Field(default="engine-0", min_length=1)
    state_dir: Path = Path("state")
    commit_interval_ms: int = Field(default=200, ge=10, le=60_000)
    commit_max_events: int = Field(default=2_000, ge=1)
    # Steps 4-5 of a commit that records wait behind (a backlog) run in a worker thread while
    # the loop folds them into the next transaction (COMMIT_PROTOCOL.md, "Overlap"); a commit
    # started because the queue was drained, or any with false, runs them in the loop.
    commit_overlap: bool = True
    # The broker aborts a transaction open this long. One is legitimately open for the commit
    # interval plus steps 3-5 (tens of ms; seconds across a broker restart), so 10 s leaves
    # room; it must exceed commit_interval_ms by TXN_TIMEOUT_MARGIN_MS (checked below). A killed
    # instance's transaction is ended at once by its partitions' next owner (step A0,
    # engine/runtime/fencing.py); when it cannot be (README "Failover"), decisions on those
    # partitions wait this long plus the broker's
    # transaction.abort.timed.out.transaction.cleanup.interval.ms (10 s by Kafka's default).
    transaction_timeout_ms: int = Field(default=10_000, ge=1_000)
    session_timeout_ms: int = Field(default=10_000, ge=1_000, le=300_000)
    metrics_port: int = Field(default=9464, ge=0, le=65_535)
    # A Kafka call may block for transaction_timeout + this margin before the watchdog ends the
    # process (COMMIT_PROTOCOL.md, "Deadlines"); `/healthz` fails after this long without a
    # completed loop iteration (the chart's liveness probe is derived from the same value).
    watchdog_margin_s: float = Field(default=30.0, ge=1.0, le=600.0)
    liveness_timeout_s: float = Field(default=60.0, ge=1.0, le=3_600.0)
    # Inputs are folded in event-time order across the topics of a partition: a record waits
    # for the other topics' records (or their end) at most this long once nothing more is
    # fetched; an input partition whose buffer holds this many records is paused meanwhile.
    order_wait_ms: int = Field(default=50, ge=0, le=10_000)
    order_max_buffered: int = Field(default=500, ge=1, le=100_000)
    # Memory bounds (README, "Memory"). Decoded committed states kept in memory, all tasks
    # together (estimated bytes, LRU); librdkafka's pre-fetched input records (fetch.max.bytes
    # is half of it; the restore consumer gets the same); the producer's local queue (a full
    # queue waits for deliveries); SQLite's page cache, all local stores together.
    read_cache_mb: int = Field(default=64, ge=1, le=65_536)
    fetch_queue_mb: int = Field(default=16, ge=1, le=2_048)
    producer_queue_mb: int = Field(default=32, ge=4, le=2_048)
    # How long the producer gathers a batch's records before sending them. The commit flushes
    # at once whatever the linger, so a longer one costs no decision latency; it saves produce
    # requests, which cost the broker about as much CPU per input as the engine's own (README,
    # "Performance").
    producer_linger_ms: int = Field(default=50, ge=0, le=1_000)
    store_cache_mb: int = Field(default=8, ge=1, le=4_096)
    # glibc: the engine child's MALLOC_ARENA_MAX (0: glibc's default of 8 per core) and how
    # often the loop hands freed memory back with malloc_trim (0: never). engine/runtime/memory.py
    malloc_arena_max: int = Field(default=2, ge=0, le=64)
    memory_trim_interval_s: float = Field(default=10.0, ge=0.0, le=3_600.0)
    # The loop allocates a few objects per input and frees nearly all of them by refcount: the
    # cyclic collector's generation-0 threshold sets how often it scans them anyway (0: Python's
    # 700). 50,000: engine CPU per input 48-50 us against 53-58 at 700 (paired throughput runs).
    # engine/runtime/memory.py; what stays alive is frozen after each commit (collector.py)
    gc_gen0_threshold: int = Field(default=50_000, ge=0, le=10_000_000)
    # `reconciler run` starts this many engine processes in the group (one per core): each gets
    # `<instance_id>-<i>`, `<state_dir>/process-<i>` and metrics port `metrics_port + i`.
    processes: int = Field(default=1, ge=1, le=64)
    # `reconciler run` restarts a dead engine after 0.5 s, doubling per quick failure up to this.
    restart_backoff_max_s: float = Field(default=30.0, ge=0.0, le=600.0)
    # After a fatal Kafka error the engine rejoins with new clients after 0.5 s, doubling per
    # rejoin in a row with no committed transaction in between, up to this.
    rejoin_backoff_max_s: float = Field(default=30.0, ge=0.0, le=600.0)
    # "json": every log line is one JSON object (engine/oplog.py); "text": plain lines.
    log_format: Literal["text", "json"] = "text"
    # Confluent-compatible Schema Registry: inputs framed with its 5-byte header (magic 00 +
    # schema id) are decoded next to single-object ones. Empty: single-object only.
    schema_registry_url: str | None = None
    # Diagnostic, off by default: a CSV line per folded input with its time at each loop step
    # (engine/runtime/trace.py), appended at commit; `tools/bench_latency.py --trace` reads it.
    latency_trace_path: Path | None = None
    kafka: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _transaction_outlives_the_commit_interval(self) -> Settings:
        least = self.commit_interval_ms + TXN_TIMEOUT_MARGIN_MS
        if self.transaction_timeout_ms < least:
            raise ValueError(
                f"transaction_timeout_ms ({self.transaction_timeout_ms}) must be at least"
                f" commit_interval_ms ({self.commit_interval_ms}) + {TXN_TIMEOUT_MARGIN_MS}"
                " for steps 3-5 to finish before the broker aborts the transaction: set"
                f" transaction_timeout_ms to {least} or more, or lower commit_interval_ms"
            )
        return self

    @property
    def topics(self) -> TopicNames:
        return TopicNames(prefix=self.topic_prefix)

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """A librdkafka configuration: bootstrap servers, pass-through settings, then overrides."""
        config: dict[str, str | int | float | bool] = {"bootstrap.servers": self.bootstrap_servers}
        config.update(self.kafka)
        config.update(overrides)
        return config

    def redacted(self) -> dict[str, Any]:
        """The settings as a dict fit for a log line: secret-looking values hidden."""
        data = self.model_dump(mode="json")
        data["kafka"] = {
            key: ("***" if any(m in key.lower() for m in _SECRET_MARKERS) else value)
            for key, value in self.kafka.items()
        }
        return data


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """`[kafka]` with nested TOML tables (`sasl.password = ...` parses as `{"sasl": {...}}`)
    becomes flat librdkafka keys: {"sasl.password": "..."}."""
    flat: dict[str, str] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return flat


def load_settings(
    path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    **overrides: Any,
) -> Settings:
    """Defaults < file < environment < explicit overrides (flags); bad input: ConfigError."""
    env = os.environ if environ is None else environ
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw.update(tomllib.loads(path.read_text()))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(
                f"cannot read settings file {path}: {exc}.",
                "pass an existing TOML file with --config.",
            ) from exc
    kafka = _flatten(raw.pop("kafka", {}))
    for name in Settings.model_fields:
        value = env.get(f"{ENV_PREFIX}{name.upper()}")
        if value is not None and name != "kafka":
            raw[name] = value
    for key, value in env.items():
        if key.startswith(KAFKA_ENV_PREFIX):
            kafka[key[len(KAFKA_ENV_PREFIX) :].lower().replace("_", ".")] = value
    raw.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return Settings(**raw, kafka=kafka)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(
            f"invalid settings: {problems}.",
            "correct the file, RECONCILER_* variable or flag named.",
        ) from exc
