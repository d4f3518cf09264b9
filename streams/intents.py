"""The agent's records that cannot wait for its transaction: attempt intents (produced and
acknowledged before a request goes out) and breaker transitions.

One idempotent, non-transactional producer (``acks=all``): a record is durable once
:meth:`DirectLog.send` returns, whatever happens to the agent's open transaction. Waits are
batched: the intents of every send started within ``linger.ms`` share one produce request
and one acknowledgement, and while any send waits, one task on the event loop serves the
producer's delivery reports every ``poll_s`` (each report resolves its send's future right
there: no thread, no wake-up per record).
"""

from __future__ import annotations

import asyncio
import logging

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from postbacks.kafka import watchdog
from postbacks.kafka.clients import make_producer
from postbacks.settings import Settings

__all__ = ["DirectLog"]

log = logging.getLogger(__name__)


def _fatal(err: object, topic: str) -> None:
    """A fatal error of the idempotent producer (the broker lost records it had
    acknowledged, an unclean leader election) refuses every later produce: the agent
    restarts before it sends or dead-letters anything else (it used to dead-letter every
    later delivery as ``internal_error``). Its open transaction is aborted: nothing lost."""
    if isinstance(err, KafkaError) and err.fatal():
        watchdog.restart_in_place(f"agent: the direct producer's fatal error on {topic}: {err}",
                         backoff_s=1.0)


class DirectLog:
    def __init__(self, settings: Settings, *, linger_ms: int = 1, poll_s: float = 0.0005,
                 producer: Producer | None = None) -> None:
        self._settings = settings
        self._producer = producer or make_producer(
            settings, **{"linger.ms": linger_ms, "client.id": "postbacks-agent-direct"})
        self._poll_s = poll_s
        self._waiting = 0
        self._poller: asyncio.Task[None] | None = None
        # published without waiting, not yet handed to the producer, latest per key
        self._pending: dict[tuple[str, bytes | None], bytes] = {}
        self._latest: dict[tuple[str, bytes | None], int] = {}  # its sequence number
        self._seq = 0

    async def _serve(self) -> None:
        try:
            while self._waiting:
                self._producer.poll(0)
                await asyncio.sleep(self._poll_s)
        finally:
            self._poller = None

    async def send(self, topic_base: str, key: bytes | None, value: bytes) -> None:
        """Produce one record and return once the broker has acknowledged it. A failed
        delivery (the broker unreachable past the producer's ``message.timeout.ms``) is
        produced again: the caller must not go on before the record is stored."""
        loop = asyncio.get_running_loop()
        topic = self._settings.topic(topic_base)
        while True:
            done: asyncio.Future[KafkaError | None] = loop.create_future()

            def report(err: KafkaError | None, _msg: Message,
                       done: asyncio.Future[KafkaError | None] = done) -> None:
                if not done.done():
                    done.set_result(err)

            try:
                self._producer.produce(topic, value, key, on_delivery=report)
            except BufferError:
                self._producer.poll(0)
                await asyncio.sleep(0.01)
                continue
            except KafkaException as exc:
                _fatal(exc.args[0] if exc.args else None, topic)
                raise
            self._waiting += 1
            if self._poller is None:
                self._poller = loop.create_task(self._serve())
            try:
                err = await done
            finally:
                self._waiting -= 1
            if err is None:
                return
            _fatal(err, topic)
            log.warning("agent: a record for %s was not stored (%s); producing it again",
                        topic, err)
            await asyncio.sleep(0.5)

    def publish(self, topic_base: str, key: bytes | None, value: bytes) -> None:
        """Produce without waiting (breaker transitions: only the latest per key counts).
        One the producer's queue has no room for, or the broker did not store, is kept and
        produced again (:meth:`retry_pending`) unless a later one for its key came: it was
        dropped, and a restarted or another agent sent to an endpoint whose breaker was
        open here."""
        self._seq += 1
        self._pending[(topic_base, key)] = value
        self._latest[(topic_base, key)] = self._seq
        self.retry_pending()

    def retry_pending(self) -> None:
        """Hand the kept records to the producer (and serve its delivery reports)."""
        self._producer.poll(0)
        for k in list(self._pending):
            topic_base, key = k
            value, seq = self._pending[k], self._latest[k]

            def report(err: KafkaError | None, _msg: Message, k: tuple[str, bytes | None] = k,
                       value: bytes = value, seq: int = seq) -> None:
                if err is None:
                    if self._latest.get(k) == seq and k not in self._pending:
                        del self._latest[k]  # stored, and the latest: nothing to keep
                    return
                _fatal(err, k[0])
                if self._latest.get(k) == seq and k not in self._pending:
                    log.warning("agent: a record for %s was not stored (%s); producing it "
                                "again", k[0], err)
                    self._pending[k] = value

            try:
                self._producer.produce(self._settings.topic(topic_base), value, key,
                                       on_delivery=report)
            except BufferError:
                return  # kept; the next call tries again
            except KafkaException as exc:
                _fatal(exc.args[0] if exc.args else None, topic_base)
                # refused for good (the topic deleted, no right to it): said, not retried
                # every second, and the other keys' records still go
                log.error("agent: a record for %s cannot be produced: %s", topic_base, exc)
            del self._pending[k]

    def close(self, timeout_s: float = 10.0) -> None:
        self._producer.flush(timeout_s)
