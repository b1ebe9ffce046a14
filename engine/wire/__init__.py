"""The wire contract: versioned Avro schemas, a strict codec and the version policy.

Importing this package loads the shipped schemas and checks them against the policy. It never
imports a Kafka producer/consumer or the engine runtime; the Schema Registry client is imported
only when `RegistryFraming` is built.
"""

from engine.wire.codec import MODEL_OF, RECORD_TYPE_OF, Codec, WireModel
from engine.wire.dead_letter import DeadLetter
from engine.wire.errors import (
    DecodeError,
    DecodeReason,
    EncodeError,
    SchemaPolicyError,
    SourcePosition,
    WireError,
)
from engine.wire.framing import Framing, SingleObjectFraming
from engine.wire.limits import DEFAULT_LIMITS, WireLimits
from engine.wire.policy import POLICY, RecordPolicy, RecordType
from engine.wire.registry import RegistryFraming, RegistryUnavailableError
from engine.wire.schema_store import SHIPPED_SCHEMAS, SchemaStore, ShippedSchema

__all__ = [
    "DEFAULT_LIMITS",
    "MODEL_OF",
    "POLICY",
    "RECORD_TYPE_OF",
    "SHIPPED_SCHEMAS",
    "Codec",
    "DeadLetter",
    "DecodeError",
    "DecodeReason",
    "EncodeError",
    "Framing",
    "RecordPolicy",
    "RecordType",
    "RegistryFraming",
    "RegistryUnavailableError",
    "SchemaPolicyError",
    "SchemaStore",
    "ShippedSchema",
    "SingleObjectFraming",
    "SourcePosition",
    "WireError",
    "WireLimits",
    "WireModel",
]
