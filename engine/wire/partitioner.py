"""The Java client's default key partitioner (murmur2), so every producer agrees on partitions.

Kafka's Java producer, librdkafka with ``partitioner=murmur2_random`` and this function put a
keyed record in the same partition. The engine relies on it twice: input topics are
co-partitioned by session id, and a runner reads only the decisions partition of its session.
"""

from __future__ import annotations

_MASK = 0xFFFFFFFF
_SEED = 0x9747B28C
_M = 0x5BD1E995


def murmur2(data: bytes) -> int:
    """The 32-bit murmur2 hash as Kafka's Java ``Utils.murmur2`` computes it (signed int)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length % 4
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: str | bytes, partitions: int) -> int:
    """The partition of a keyed record among ``partitions`` (Java ``toPositive(murmur2) % n``)."""
    if partitions < 1:
        raise ValueError(f"partition count must be positive, got {partitions}")
    raw = key.encode() if isinstance(key, str) else key
    return (murmur2(raw) & 0x7FFFFFFF) % partitions
