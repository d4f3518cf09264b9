"""The gate's progress watchdog against the real broker: a committed offset that does not
move while a record waits is a stall; a transaction's commit marker after the last record
is not (the gate commits past records, never past markers). And the watch, on a thread of
its own, restarts a gate whose event loop has stopped turning."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition

from postbacks.kafka.clients import make_transactional_producer
from postbacks.settings import Settings
from postbacks.tools.procs import wait_for
from streams.anomaly_gate.stall import ProgressWatch
from topics import TOPICS


def _leaders_known(watch: ProgressWatch, settings: Settings) -> None:
    """Wait until the watch's client reads every watched partition's high water mark: on
    topics created a moment ago a "not leader" answer makes a check skip (and forget what
    it saw), which is right for the gate but would make this test's timeline slip."""
    c = watch._client()
    tps = [TopicPartition(settings.topic(base), p)
           for base, n in ((TOPICS.deliveries.base, TOPICS.deliveries.partitions),
                           (TOPICS.anomaly_partials.base, TOPICS.anomaly_partials.partitions))
           for p in range(n)]

    def all_read() -> bool:
        for tp in tps:
            c.get_watermark_offsets(tp, timeout=5)
        return True

    wait_for(all_read, 30, interval=0.1, what="every watched partition's leader")


def _commit(settings: Settings, group: str, topic: str, offset: int) -> None:
    c = Consumer({"bootstrap.servers": settings.kafka_bootstrap_servers, "group.id": group,
                  "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        c.close()


def test_records_waiting_on_a_partition_never_committed_are_a_stall(
        settings: Settings) -> None:
    """A partition handed over in a rebalance before its first commit: nothing committed,
    records waiting from the oldest one."""
    topic = settings.topic(TOPICS.deliveries.base)
    group = f"{settings.topic_prefix}postbacks-gate-{uuid.uuid4().hex[:6]}"
    p = make_transactional_producer(settings, "watch-never")
    p.begin_transaction()
    p.produce(topic, b"one", b"k", partition=2)
    p.commit_transaction(30)
    watch = ProgressWatch(settings, group, stall_s=10.0)
    try:
        _leaders_known(watch, settings)
        assert watch.stalled(now=100.0) is None  # first sight
        assert watch.stalled(now=105.0) is None
        stuck = watch.stalled(now=111.0)
        assert stuck is not None and f"{topic}[2] never committed, offset 0" in stuck
        c = Consumer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                      "group.id": group, "enable.auto.commit": False})
        try:
            c.commit(offsets=[TopicPartition(topic, 2, 2)], asynchronous=False)
        finally:
            c.close()
        assert watch.stalled(now=200.0) is None  # processed: only the marker is left
    finally:
        watch.close()


def test_a_waiting_record_behind_a_still_offset_is_a_stall_a_marker_is_not(
        settings: Settings) -> None:
    topic = settings.topic(TOPICS.deliveries.base)
    group = f"{settings.topic_prefix}postbacks-gate-{uuid.uuid4().hex[:6]}"
    p = make_transactional_producer(settings, "watch-test")
    p.begin_transaction()
    p.produce(topic, b"one", b"k", partition=0)
    p.commit_transaction(30)  # offset 0: the record; offset 1: the commit marker
    watch = ProgressWatch(settings, group, stall_s=10.0)
    try:
        _leaders_known(watch, settings)
        _commit(settings, group, topic, 1)  # processed the record: only the marker is left
        assert watch.stalled(now=100.0) is None
        assert watch.stalled(now=200.0) is None  # still, but nothing is waiting

        _commit(settings, group, topic, 0)  # the record is not processed
        assert watch.stalled(now=300.0) is None  # first sight of this offset
        assert watch.stalled(now=305.0) is None  # still within stall_s
        stuck = watch.stalled(now=311.0)
        assert stuck is not None and f"{topic}[0] committed offset 0" in stuck

        _commit(settings, group, topic, 1)  # progress again
        assert watch.stalled(now=400.0) is None
        assert watch.stalled(now=500.0) is None  # a quiet spell: only the marker after it

        p.begin_transaction()  # a record after the quiet spell, not yet processed: no
        p.produce(topic, b"two", b"k", partition=0)  # stall before the gate had its chance
        p.commit_transaction(30)
        assert watch.stalled(now=501.0) is None
        assert watch.stalled(now=507.0) is None
        stuck = watch.stalled(now=511.0)  # ... but one 10 s later
        assert stuck is not None and f"{topic}[0] committed offset 1" in stuck
    finally:
        watch.close()


class _Restarted(Exception):
    pass


def test_an_event_loop_that_stops_turning_restarts_the_gate_from_the_watch_thread(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch runs on a thread of its own: an event loop whose last turn is older than
    ``stall_restart_s`` restarts the gate (stacks dumped) even with no partition stalled;
    one that turns does not."""
    import dataclasses
    import threading
    import time
    import types

    from streams.anomaly_gate import runner

    calls: list[tuple[str, bool]] = []

    def fake_restart(reason: str, *, dump: bool = False, backoff_s: float = 0.0) -> None:
        calls.append((reason, dump))
        raise _Restarted

    monkeypatch.setattr(runner, "restart_in_place", fake_restart)
    gate = types.SimpleNamespace(
        settings=dataclasses.replace(settings, stall_restart_s=3.0),
        app=types.SimpleNamespace(conf=types.SimpleNamespace(id=f"{settings.topic_prefix}g")),
        _tick=time.monotonic())
    stop = threading.Event()

    def keep_turning() -> None:  # a loop that turns: no restart while it does
        while not stop.is_set():
            gate._tick = time.monotonic()
            time.sleep(0.1)

    turner = threading.Thread(target=keep_turning, daemon=True)
    turner.start()
    threading.Timer(7.0, stop.set).start()
    runner.GateProcess._watch_progress(gate, stop)  # type: ignore[arg-type]
    assert calls == []
    turner.join(5)

    gate._tick = time.monotonic() - 10  # the loop last turned 10 s ago
    bounded = threading.Event()  # the watch ends by itself if it never restarts
    threading.Timer(12.0, bounded.set).start()
    with pytest.raises(_Restarted):
        runner.GateProcess._watch_progress(gate, bounded)
    assert len(calls) == 1 and "event loop has not turned" in calls[0][0] and calls[0][1]


def test_a_check_that_fails_is_made_again_with_a_new_client(settings: Settings) -> None:
    """After a broker's loss the watch's client kept timing out on the dead leader: a failed
    check drops the client, and the next one reads the leaders afresh."""
    from confluent_kafka import KafkaError, KafkaException

    group = f"{settings.topic_prefix}postbacks-gate-{uuid.uuid4().hex[:6]}"
    watch = ProgressWatch(settings, group, stall_s=10.0)
    try:
        _leaders_known(watch, settings)
        real = watch._client()

        class TimingOut:
            closed = False

            def committed(self, *_a: object, **_k: object) -> None:
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Local: Timed out"))

            def close(self) -> None:
                self.closed = True
                real.close()

        stale = TimingOut()
        watch._consumer = stale  # type: ignore[assignment]
        assert watch.stalled(now=100.0) is None  # skipped, not a stall
        assert stale.closed and watch._consumer is None
        assert watch.stalled(now=101.0) is None  # a new client, reading the broker
        assert watch._consumer is not None and watch._consumer is not real
    finally:
        watch.close()
