"""murmur2 matches the vectors of Kafka's Java UtilsTest (integration tests check librdkafka)."""

from __future__ import annotations

import pytest

from engine.wire.partitioner import murmur2, partition_for

JAVA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("data", "expected"), JAVA_VECTORS.items())
def test_java_vectors(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_partition_is_in_range_and_stable() -> None:
    for n in (1, 3, 6, 64):
        for key in ("s", "session-1", "ü-session"):
            p = partition_for(key, n)
            assert 0 <= p < n
            assert p == partition_for(key.encode(), n)


def test_zero_partitions_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        partition_for("s", 0)
