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
        """Produce without waiting (breaker transitions: the next one supersedes it)."""
        try:
            self._producer.produce(self._settings.topic(topic_base), value, key)
        except BufferError:
            log.warning("agent: producer queue full; a breaker transition was not published")
        except KafkaException as exc:
            _fatal(exc.args[0] if exc.args else None, topic_base)
            raise

    def close(self, timeout_s: float = 10.0) -> None:
        self._producer.flush(timeout_s)
