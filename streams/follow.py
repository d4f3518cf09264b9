"""Following a compacted topic of BreakerState records from its beginning, on a thread of
its own: the agents' shared breakers (``breakers.v1``, streams/breakers.py) and the
anomaly halts (``anomaly.control.v1``, streams/halts.py).

The consumer is assigned every partition, never subscribed: no group membership and no
commits (its group id is a name the client needs, nothing more). Compaction keeps each
key's latest record, so reading from the beginning rebuilds the current state; then it
keeps reading, so a change written by any process is seen here within a poll.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from postbacks.codec import codec_for
from postbacks.errors import DeadLetterError
from postbacks.kafka.clients import make_consumer
from postbacks.records import BreakerStateRecord
from postbacks.settings import Settings
from topics.registry import TopicSpec

__all__ = ["Follower"]

log = logging.getLogger(__name__)


class Follower:
    """Hands every decodable record of ``spec``'s topic to ``hand_over`` on the event loop,
    in order, a batch at a time. :attr:`caught_up` is set once the records that were there
    at start have all been handed over."""

    def __init__(self, settings: Settings, loop: asyncio.AbstractEventLoop, spec: TopicSpec,
                 client: str, hand_over: Callable[[list[BreakerStateRecord]], None]) -> None:
        self._loop = loop
        self._hand_over = hand_over
        self.name = spec.base
        self._codec = codec_for("BreakerState")
        self.caught_up = asyncio.Event()
        self._stop = threading.Event()
        self._consumer = make_consumer(settings, client, **{"enable.partition.eof": True})
        topic = settings.topic(spec.base)
        parts = self._consumer.list_topics(topic, timeout=10).topics[topic].partitions
        self._left = set(parts)
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        self._thread = threading.Thread(target=self._serve, name=spec.base, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                self._poll()
            except RuntimeError:  # the event loop closed under us: the agent is stopping
                return
            except Exception:  # never end silently: the state would stop moving
                log.exception("%s: reading failed; retrying", self.name)
                self._stop.wait(1.0)

    def _poll(self) -> None:
        got: list[BreakerStateRecord] = []
        for m in self._consumer.consume(500, 0.2):
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    self._left.discard(m.partition() or 0)
                else:
                    log.warning("%s: %s", self.name, err)
                continue
            if m.value() is None:
                continue  # a tombstone
            try:
                got.append(self._codec.decode(m.value()))  # type: ignore[arg-type]
            except DeadLetterError as exc:
                log.warning("%s: undecodable record at offset %s: %s", self.name,
                            m.offset(), exc)
        if got:
            self._loop.call_soon_threadsafe(self._hand_over, got)
        if not self._left and not self.caught_up.is_set():
            self._loop.call_soon_threadsafe(self.caught_up.set)  # after the above

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._consumer.close()
