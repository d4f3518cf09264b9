"""The agents' shared, durable circuit breakers: ``breakers.v1`` (compacted, keyed by
endpoint id, one BreakerState record per transition; core/breaker.py has the rules).

Every agent publishes its own transitions and follows the topic: at start it reads it from
the beginning (the latest transition of every endpoint, kept by compaction) before it sends
anything, so an agent started while an endpoint's breaker is open does not send to it; then
it keeps reading, so a breaker opened by one agent is open in every agent within a poll.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from postbacks.codec import codec_for
from postbacks.core.breaker import BreakerState, from_record, to_record
from postbacks.errors import DeadLetterError
from postbacks.kafka.clients import make_consumer
from postbacks.records import BreakerStateRecord
from postbacks.settings import Settings
from streams.intents import DirectLog
from topics import TOPICS
from topics.admin import create_topics

__all__ = ["BreakerFollower", "breaker_publisher"]

log = logging.getLogger(__name__)

Adopt = Callable[[str, BreakerState], None]


def breaker_publisher(direct: DirectLog, actor: str) -> Adopt:
    """Publishes this agent's transitions (no wait: a lost one is superseded by the next,
    and each agent still holds its own state)."""
    codec = codec_for("BreakerState")

    def publish(endpoint_id: str, state: BreakerState) -> None:
        direct.publish(TOPICS.breakers.base, endpoint_id.encode(),
                       codec.encode(to_record(endpoint_id, state, actor)))

    return publish


class BreakerFollower:
    """Reads ``breakers.v1`` on a thread of its own; hands every circuit-breaker record to
    ``adopt`` on the event loop, in order. :attr:`caught_up` is set once the records that
    were there at start have all been handed over."""

    def __init__(self, settings: Settings, loop: asyncio.AbstractEventLoop,
                 adopt: Adopt) -> None:
        create_topics(settings, [TOPICS.breakers])  # idempotent; verifies its configs
        self._loop = loop
        self._adopt = adopt
        self._codec = codec_for("BreakerState")
        self.caught_up = asyncio.Event()
        self._stop = threading.Event()
        # Assigned, never subscribed: no group membership and no commits (the group id is
        # a name the client needs, nothing more).
        self._consumer = make_consumer(settings, "postbacks-agent-breakers",
                                       **{"enable.partition.eof": True})
        topic = settings.topic(TOPICS.breakers.base)
        parts = self._consumer.list_topics(topic, timeout=10).topics[topic].partitions
        self._left = set(parts)
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        self._thread = threading.Thread(target=self._serve, name="breakers", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                got: list[tuple[str, BreakerState]] = []
                for m in self._consumer.consume(500, 0.2):
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            self._left.discard(m.partition() or 0)
                        else:
                            log.warning("breakers: %s", err)
                        continue
                    if m.value() is None:
                        continue  # a tombstone
                    try:
                        rec: BreakerStateRecord = self._codec.decode(m.value())  # type: ignore[assignment]
                    except DeadLetterError as exc:
                        log.warning("breakers: undecodable record at offset %s: %s",
                                    m.offset(), exc)
                        continue
                    state = from_record(rec)
                    if state is not None:
                        got.append((rec["scope_key"], state))
                if got:
                    self._loop.call_soon_threadsafe(self._hand_over, got)
                if not self._left and not self.caught_up.is_set():
                    self._loop.call_soon_threadsafe(self.caught_up.set)  # after the above
        except RuntimeError:  # the event loop closed under us: the agent is stopping
            pass

    def _hand_over(self, got: list[tuple[str, BreakerState]]) -> None:
        for endpoint_id, state in got:
            self._adopt(endpoint_id, state)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._consumer.close()
