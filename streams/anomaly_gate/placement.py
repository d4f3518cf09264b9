"""Whether a delivery read by the gate is where the gate can judge it, and small enough to
pass on. Pure.

The gate keeps one endpoint's rolling state with the partition its deliveries are on, and
counts a delivery only when its offset is past the one stored with that state. A delivery
of the endpoint on another partition (produced with another key, no key, or another
partitioner: librdkafka's default is not Kafka's) moved that offset to a number from a
different log, so the endpoint's own deliveries below it were no longer counted: one stray
record switched its payout detector off. Such a delivery is dead-lettered
(``invalid_record``, naming the key or partition), as is one the gate's producer could not
send on (``too_large``: it restarted on it for ever).
"""

from __future__ import annotations

from aiokafka.partitioner import murmur2

from postbacks.errors import DeadLetterError
from postbacks.kafka.stage import MESSAGE_MAX

__all__ = ["OUT_SLACK", "check_placed", "home_partition"]

OUT_SLACK = 4096  # what the gate adds to a delivery it passes on (enqueued_at, hold reason)


def home_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's Java client, Faust and librdkafka's ``murmur2_random`` put
    ``key`` on (the fan-out's producers use it)."""
    return (int(murmur2(key)) & 0x7FFFFFFF) % partitions


def check_placed(key: bytes | None, value_len: int, partition: int, endpoint_id: str,
                 partitions: int) -> None:
    """Raise :class:`DeadLetterError` when the gate must not judge this delivery.
    ``partitions``: of ``deliveries.v1`` (0: the partition is not checked)."""
    want = endpoint_id.encode()
    if key != want:
        shown = "no key" if key is None else f"key {key[:80]!r}"
        raise DeadLetterError(
            f"delivery of {endpoint_id!r} with {shown}: a delivery is keyed by its "
            "endpoint_id, so that its endpoint's deliveries share one partition (the gate's "
            "state and the agent's order depend on it)", reason="invalid_record")
    if partitions and partition != (home := home_partition(want, partitions)):
        raise DeadLetterError(
            f"delivery of {endpoint_id!r} on partition {partition}, where its key belongs on "
            f"{home} of {partitions} (murmur2, as Kafka's Java client; librdkafka: "
            "partitioner=murmur2_random)", reason="invalid_record")
    if len(want) + value_len + OUT_SLACK > MESSAGE_MAX:
        raise DeadLetterError(
            f"delivery of {endpoint_id!r} is {value_len:,} bytes: the gate passes on at most "
            f"{MESSAGE_MAX - OUT_SLACK - len(want):,} (its producer's message limit)",
            reason="too_large")
