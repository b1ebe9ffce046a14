"""The schema-version policy: which versions of each record exist, and what each added.

Rules (read before bumping):

* A version is the Avro schema in ``schemas/<record>.v<N>.avsc``; the file name carries the
  version, the record's full name (``io.reconciler.<Name>``) does not, because Avro schema
  resolution matches named types by full name and every bump would otherwise need aliases.
* A new version must be readable by resolution from every supported older version: new fields
  get defaults, enums only grow and keep their ``default`` symbol, nothing is renamed without
  an alias. The one exception is a *break*, listed in ``breaks``: a version that Avro
  resolution would read wrongly from the one before (session_state v3 writes digests as 32 raw
  bytes where v2 wrote 64 hex characters, and resolution promotes the text to its 64 bytes).
  A record written before a break is read with the newest schema of its own line
  (`RecordPolicy.reader_version`), and the codec turns both lines into the same value; the
  fixtures of every version hold it to that. Only the engine's own records may break: a
  runner must be able to read what the engine writes.
* Bumping means: add the file, add the version with a one-line summary to its record's
  ``supported`` mapping in `POLICY` below and make it ``current``, then run
  ``.venv/bin/python -m tools.gen_wire_fixtures`` to write its fixtures (the corpus test fails
  until then), and describe the new fields in ``schemas/SPEC.md`` (section 7).
* A version leaves ``supported`` only when no producer can still write it; its file and
  fixtures go with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

NAMESPACE = "io.reconciler"


class RecordType(StrEnum):
    """Every record type on every topic. The value is the schema file stem."""

    INTENT = "intent"
    ACK = "ack"
    RESUME = "resume"
    REPAIR = "repair"
    DECISION = "decision"
    DEAD_LETTER = "dead_letter"
    SESSION_STATE = "session_state"


@dataclass(frozen=True, slots=True)
class RecordPolicy:
    """The versions of one record type. Invariant: ``current`` is in ``supported``."""

    record_name: str
    current: int
    supported: Mapping[int, str]
    breaks: frozenset[int] = frozenset()

    def reader_version(self, writer: int) -> int:
        """The schema a record written with ``writer`` is read with: the newest supported
        version that Avro resolution reaches from it (no break in between)."""
        reader = writer
        for version in sorted(v for v in self.supported if v > writer):
            if version in self.breaks:
                break
            reader = version
        return reader

    @property
    def full_name(self) -> str:
        """The Avro full name shared by every version, e.g. ``io.reconciler.Intent``."""
        return f"{NAMESPACE}.{self.record_name}"


def _policy(
    record_name: str, current: int, supported: dict[int, str], breaks: frozenset[int] = frozenset()
) -> RecordPolicy:
    if current not in supported or not breaks <= set(supported):
        raise AssertionError(f"{record_name}: current version or a break is not supported")
    return RecordPolicy(record_name, current, MappingProxyType(dict(supported)), breaks)


POLICY: Mapping[RecordType, RecordPolicy] = MappingProxyType(
    {
        RecordType.INTENT: _policy(
            "Intent",
            3,
            {
                1: "register/held/release/discard of a pending Session write",
                2: "Binding.items_digest_stable, nullable persisted_count",
                3: "causal context: producer, seq and the events it follows",
            },
        ),
        RecordType.ACK: _policy(
            "Ack",
            2,
            {
                1: "append outcome: committed with observed tail, not written, unknown",
                2: "causal context: producer, seq and the events it follows",
            },
        ),
        RecordType.RESUME: _policy(
            "Resume",
            3,
            {
                1: "restored runner's checkpoint record, reread tail and identity",
                2: "checkpoint_session_id; Binding.items_digest_stable",
                3: "causal context: the checkpoint runner's last event and the store's last ack",
            },
        ),
        RecordType.REPAIR: _policy(
            "Repair", 1, {1: "operator resolution of an ambiguous session, with actor and reason"}
        ),
        RecordType.DECISION: _policy(
            "Decision",
            2,
            {
                1: "verdict, reason code, fence token, binding and decision trail",
                2: "runner_action; reasons HISTORY_CHANGED, DIGEST_UNSTABLE, INTENT_NEVER_ARRIVED",
            },
        ),
        RecordType.DEAD_LETTER: _policy(
            "DeadLetter",
            2,
            {
                1: "refused input: raw bytes, source position, reason code",
                2: "bounded excerpt with lengths, SHA-256 and a truncated flag; PROCESSING_FAILED",
            },
        ),
        RecordType.SESSION_STATE: _policy(
            "SessionState",
            4,
            {
                1: "per-session fold state for the compacted changelog",
                2: "parked_intents, new reasons, digest stability, nullable persisted_count",
                3: "item digests as 32 raw bytes (fixed Sha256), a third less per idle session",
                4: "causal order: producer marks, inputs waiting for their causes",
            },
            breaks=frozenset({3}),
        ),
    }
)


def schema_file_name(record_type: RecordType, version: int) -> str:
    """The shipped file name of one version, e.g. ``intent.v1.avsc``."""
    return f"{record_type.value}.v{version}.avsc"


def expected_schema_files() -> frozenset[str]:
    """Every file the policy says must ship, and no other."""
    return frozenset(
        schema_file_name(record_type, version)
        for record_type, policy in POLICY.items()
        for version in policy.supported
    )
