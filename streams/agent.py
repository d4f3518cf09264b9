"""Delivery agent: dispatch.v1 -> HTTP -> attempts.v1, outcomes.v1, retry.* (retries, and
diverts due over a minute ahead), held.v1, quarantine.v1, dlq.v1.

Consumption, lanes and commits run side by side on one event loop: records are consumed
in batches (on a single Kafka thread), spread over per-endpoint lanes (see lanes.py), and
every ``commit_interval_ms`` the outputs of every finished record are produced in **one
Kafka transaction** with the commit that covers them: the lowest unfinished offset plus
the finished records above it, in the commit metadata (see offsets.py). HTTP is
at-least-once: a crash after a send and before its commit re-sends the delivery with the
same idempotency key; everything between topics is exactly-once. Each request's intent is
acknowledged by the broker before the request is sent (streams/intents.py), so the first
request of such a pair is in the attempt log too; and the endpoints' breakers are shared
with every other agent through ``breakers.v1`` (streams/breakers.py). A delivery of a
scope the anomaly gate has tripped is held, not sent (streams/halts.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from postbacks.codec import codec_for
from postbacks.core.endpoint import Endpoint
from postbacks.db.crypto import SecretBox
from postbacks.db.endpoint_cache import EndpointCache
from postbacks.ids import new_id
from postbacks.kafka.clients import (
    check_broker,
    consume_ready,
    make_consumer,
    records,
)
from postbacks.kafka.stage import Output, commit_batch
from postbacks.kafka.txn import TxnProducer
from postbacks.kafka.watchdog import subscribe_watched
from postbacks.loopwatch import LoopWatch
from postbacks.metrics import STAGE_RECORDS, UNFINISHED
from postbacks.policies import breaker_policy, retry_policy
from postbacks.settings import Settings
from postbacks.transport.http import HttpTransport
from streams.breakers import BreakerFollower, breaker_publisher
from streams.delivery import Deliverer
from streams.halts import AgentHalts, follow_halts
from streams.intents import DirectLog
from streams.lanes import Lanes
from streams.offsets import Tracker, decode_done
from streams.strict import load_states
from topics import TOPICS
from topics.admin import create_topics

__all__ = ["run_agent"]

log = logging.getLogger(__name__)

GROUP = "postbacks-agent"
_DEAD_LETTERS = codec_for("DeadLetter")


class _Endpoints:
    """Endpoint lookup; an id the view lacks asks for a refresh without waiting for it (a
    database that hangs must not hold up the event loop)."""

    def __init__(self, cache: EndpointCache) -> None:
        self._cache = cache

    def __call__(self, endpoint_id: str) -> Endpoint | None:
        ep = self._cache.get(endpoint_id)
        if ep is None:
            self._cache.request_refresh()
        return ep

    def checked_ms(self) -> int:
        """When the view was last known current (this process's clock)."""
        return self._cache.checked_ms


async def _run(settings: Settings, stop: threading.Event) -> None:
    cache = EndpointCache(
        settings.database_url, SecretBox(settings.secrets_key.reveal()), settings.config_refresh_s
    )
    cache.start()
    consumer = make_consumer(settings, GROUP)
    producer = TxnProducer.create(settings, "agent")
    direct = DirectLog(settings)  # intents (and breaker transitions)
    # this process: the instance id and a run id of its own, new at every start
    instance = f"{settings.instance_id}/{new_id('run', int(time.time() * 1000))}"
    moves = Rebalances()
    skip = moves.skip  # finished above the committed offset, per partition
    create_topics(settings, [TOPICS.ordering])  # idempotent; verifies its configs

    def on_assign(c: Consumer, partitions: list[TopicPartition]) -> None:
        loaded: dict[tuple[str, int], set[int]] = {}
        _load_skips(c, partitions, loaded)
        moves.assign(loaded)

    subscribe_watched(consumer, [settings.topic(TOPICS.dispatch.base)], settings, GROUP, stop,
                      on_assign=on_assign,
                      on_revoke=lambda _c, parts: moves.revoke(parts))
    kafka = ThreadPoolExecutor(1, thread_name_prefix="kafka")  # every Kafka call, serialized
    loop = asyncio.get_running_loop()
    watch = LoopWatch("agent", restart_after_s=settings.stall_restart_s)
    tracker = Tracker()
    processed = STAGE_RECORDS.labels(stage="agent")
    interval = settings.commit_interval_ms / 1000
    # a read waits at most this long for its first record: stops, a full buffer's pause,
    # halts and commits are looked at this often, whatever the commit cadence
    wait = min(interval, 0.1)
    try:
        async with HttpTransport(
            timeout_s=settings.http_timeout_s, allow_loopback=settings.allow_loopback_targets,
            client=settings.http_client,
        ) as transport:
            deliverer = Deliverer(transport, retry_policy(settings), settings.failing_after,
                                  intents=direct if settings.attempt_intents else None,
                                  instance=instance)
            endpoints = _Endpoints(cache)
            halts = AgentHalts(settings.anomaly_global_key)
            lanes = Lanes(deliverer, endpoints, breaker_policy(settings),
                          settings.endpoint_budget_s, settings.endpoint_max_queue,
                          settings.quarantine_delay_s,
                          publish=breaker_publisher(direct, instance),
                          view_checked_ms=endpoints.checked_ms, halted=halts.reason)
            # every agent's breakers (and this one's before a restart), and the anomaly
            # halts, before any send
            breakers = BreakerFollower(settings, loop, lanes.adopt)
            control = follow_halts(settings, loop, halts)
            try:
                await asyncio.wait_for(breakers.caught_up.wait(), 60)
            except TimeoutError:
                log.warning("agent: breakers.v1 not read to its end within 60 s; going on")
            while not control.caught_up.is_set() and not stop.is_set():  # halts first
                try:
                    await asyncio.wait_for(control.caught_up.wait(), 30)
                except TimeoutError:
                    log.warning("agent: %s not read to its end yet; nothing is sent until "
                                "it is", control.name)
            watch.start()  # from here on, a blocked loop is a finding (start-up may block)
            last_commit = time.monotonic()
            last_wake = last_commit
            while not stop.is_set():
                room = settings.max_buffered - tracker.unfinished()
                UNFINISHED.set(tracker.unfinished())
                if room <= 0:
                    await loop.run_in_executor(kafka, consumer.pause, consumer.assignment())
                    msgs = await loop.run_in_executor(kafka, consumer.consume, 1, wait)
                    await loop.run_in_executor(kafka, consumer.resume, consumer.assignment())
                else:
                    msgs = await loop.run_in_executor(
                        kafka, consume_ready, consumer, min(settings.batch_size, room), wait
                    )
                gone, came = moves.settle()
                if gone:
                    for topic, partition in gone:
                        tracker.forget(topic, partition)
                    lanes.drop_partitions(gone)
                if came:  # strict endpoints' committed state, before their deliveries
                    loaded = await loop.run_in_executor(kafka, load_states, settings)
                    assert lanes.strict is not None
                    lanes.strict.adopt(loaded)
                for m in records(msgs, "agent"):
                    topic, partition, offset = m.topic() or "", m.partition() or 0, m.offset() or 0
                    slot = tracker.track(topic, partition, offset)
                    done = skip.get((topic, partition))
                    if done and offset in done:
                        done.discard(offset)  # finished and committed before a restart
                        slot.finish([])
                        continue
                    lanes.submit(m, slot)
                processed.inc(len(msgs))
                await asyncio.sleep(0)  # let finished sends fill their slots
                now = time.monotonic()
                if now - last_wake >= 1.0:
                    halts.recheck()
                    lanes.wake()
                    direct.retry_pending()  # breaker transitions not yet stored
                    last_wake = now
                if now - last_commit >= interval:
                    last_commit = now
                    await _commit(loop, kafka, settings, consumer, producer, tracker, lanes,
                                  skip)
            watch.stop()
            await _drain(loop, kafka, settings, consumer, producer, tracker, lanes, skip)
            breakers.close()
            control.close()
    finally:
        watch.stop()
        cache.stop()
        direct.close()
        await loop.run_in_executor(kafka, consumer.close)
        kafka.shutdown()


class Rebalances:
    """What the consumer's callbacks saw during a poll, for the loop to act on after it:
    the revoked partitions, then the assigned ones with the offsets that already finished
    above their committed offset (``skip``). The loop settles the revocations first, so a
    partition revoked and assigned again in one poll keeps the set loaded at its
    assignment (dropping it re-sent every finished delivery above the committed offset)."""

    def __init__(self) -> None:
        self.skip: dict[tuple[str, int], set[int]] = {}
        self._revoked: set[tuple[str, int]] = set()
        self._loaded: dict[tuple[str, int], set[int]] = {}
        self._assigned = False

    def revoke(self, partitions: list[TopicPartition]) -> None:
        self._revoked |= {(tp.topic, tp.partition) for tp in partitions}

    def assign(self, loaded: dict[tuple[str, int], set[int]]) -> None:
        self._loaded.update(loaded)
        self._assigned = True

    def settle(self) -> tuple[set[tuple[str, int]], bool]:
        """(the partitions revoked since the last call, whether any were assigned)."""
        gone, self._revoked = self._revoked, set()
        for tp in gone:
            self.skip.pop(tp, None)
        self.skip.update(self._loaded)
        self._loaded = {}
        came, self._assigned = self._assigned, False
        return gone, came


def _load_skips(c: Consumer, partitions: list[TopicPartition],
                skip: dict[tuple[str, int], set[int]], *, wait_s: float = 150.0) -> None:
    """Read the committed offsets' metadata: records above them that already finished.

    A read-committed consumer gets no committed offset while a transaction holding new
    offsets for the partition is open, and an agent killed mid-commit leaves one open
    until the coordinator aborts it (``transaction.timeout.ms``, 60 s): the read times out
    until then. It is tried again for up to ``wait_s``; raising out of the assignment
    restarted the process, which rebalanced the group again."""
    if not partitions:
        return
    deadline = time.monotonic() + wait_s
    while True:
        try:
            committed = c.committed(partitions, timeout=10)
            break
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if not (isinstance(err, KafkaError) and (
                    err.code() == KafkaError._TIMED_OUT or err.retriable())) \
                    or time.monotonic() > deadline:
                raise
            log.warning("agent: the committed offsets of %d partition(s) are not readable "
                        "yet (%s): a transaction of their previous owner is still open, "
                        "until its coordinator aborts it; trying again", len(partitions),
                        err.name())
            time.sleep(1.0)  # (an error that comes back at once must not spin)
    for tp in committed:
        done = decode_done(tp.offset, tp.metadata) if tp.offset >= 0 else set()
        skip[(tp.topic, tp.partition)] = done


async def _commit(loop: asyncio.AbstractEventLoop, kafka: ThreadPoolExecutor,
                  settings: Settings, consumer: Consumer, producer: TxnProducer, tracker: Tracker,
                  lanes: Lanes, skip: dict[tuple[str, int], set[int]]) -> None:
    items, commits = tracker.drain(skip)  # (skip: finished before, not read again yet)
    if not commits:
        return
    assert lanes.strict is not None
    items.extend(lanes.strict.take_writes())  # after the records they describe
    out = Output(items)
    for topic, _key, value in items:  # counted in webhook_dlq_total once committed
        if topic == TOPICS.dlq.base:
            out.dead[_DEAD_LETTERS.decode(value)["reason"]] += 1
    committed = await loop.run_in_executor(
        kafka, commit_batch, "agent", settings, consumer, producer, out, commits
    )
    if not committed:  # aborted and rewound: everything consumed will be seen again
        tracker.clear()
        lanes.clear()
        await loop.run_in_executor(kafka, _load_skips, consumer, consumer.assignment(), skip)
        loaded = await loop.run_in_executor(kafka, load_states, settings)
        assert lanes.strict is not None
        lanes.strict.reset(loaded)


async def _drain(loop: asyncio.AbstractEventLoop, kafka: ThreadPoolExecutor,
                 settings: Settings, consumer: Consumer, producer: TxnProducer, tracker: Tracker,
                 lanes: Lanes, skip: dict[tuple[str, int], set[int]],
                 timeout_s: float = 15.0) -> None:
    """On shutdown: stop taking work, let in-flight sends finish, commit what finished."""
    lanes.clear()
    if lanes.tasks:
        await asyncio.wait(list(lanes.tasks), timeout=timeout_s)
    await _commit(loop, kafka, settings, consumer, producer, tracker, lanes, skip)


def run_agent(settings: Settings, stop: threading.Event) -> None:
    check_broker(settings)
    # uvloop resolves names on libuv's thread pool, 4 threads unless this says otherwise
    # before its first use: four names whose DNS hangs would stall every other lookup.
    os.environ.setdefault("UV_THREADPOOL_SIZE", "32")
    import uvloop

    uvloop.run(_run(settings, stop))
