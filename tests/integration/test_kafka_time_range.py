"""Reading a topic by produce time (``postbacks.kafka.time_range``) on the real broker: a
topic written in transactions ends in commit markers that are never delivered, and the read
still ends; the time cut keeps [since, until) only; a missing topic is a clear error."""

from __future__ import annotations

import threading

import pytest

from postbacks.kafka.clients import make_producer, make_transactional_producer
from postbacks.kafka.time_range import read_time_range
from postbacks.settings import Settings
from topics import TOPICS


def _read(settings: Settings, topic: str, since: int, until: int,
          timeout: float = 60.0) -> list[tuple[int, bytes]]:
    """The (partition, value) pairs read, from a thread bounded by ``timeout``."""
    got: list[tuple[int, bytes]] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            for m in read_time_range(settings, topic, since, until, group_id="t-range"):
                got.append((m.partition() or 0, m.value() or b""))
        except BaseException as exc:  # reported below, in the test's thread
            failed.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"the read did not end within {timeout} s (read {len(got)})"
    if failed:
        raise failed[0]
    return got


def test_a_topic_written_in_transactions_is_read_to_its_end(settings: Settings) -> None:
    topic = settings.topic(TOPICS.deliveries.base)
    p = make_transactional_producer(settings, "t-range")
    sent: list[tuple[int, bytes]] = []
    for txn in range(3):
        p.begin_transaction()
        for part in (0, 1):
            value = f"txn{txn}-p{part}".encode()
            p.produce(topic, value, partition=part)
            sent.append((part, value))
        p.commit_transaction(30)
    got = _read(settings, topic, 0, 2**62)
    assert sorted(got) == sorted(sent)


def test_the_time_cut_keeps_since_to_until(settings: Settings) -> None:
    topic = settings.topic(TOPICS.deliveries.base)
    p = make_producer(settings)
    base = 1_700_000_000_000
    for i in range(5):
        p.produce(topic, f"r{i}".encode(), partition=0, timestamp=base + i * 1000)
    p.produce(topic, b"other", partition=1, timestamp=base + 9000)
    assert p.flush(30) == 0
    got = _read(settings, topic, base + 1000, base + 3000)
    assert [v for _, v in got] == [b"r1", b"r2"]
    assert _read(settings, topic, base + 20_000, base + 30_000) == []


def test_a_missing_topic_is_a_clear_error(settings: Settings) -> None:
    missing = settings.topic("no.such.topic.v1")
    with pytest.raises(ValueError, match=r"no\.such\.topic"):
        _read(settings, missing, 0, 2**62)
