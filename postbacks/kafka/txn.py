"""A stage's transactional producer, replaced in place when librdkafka's offset send hangs.

``send_offsets_to_transaction`` asks the consumer group's coordinator, which librdkafka
caches. When that broker leaves the cluster (kill -9, then fenced by the controller),
librdkafka 2.10+ decommissions it, and a call already waiting for it is never woken again
(confluentinc/librdkafka#5511); the call's own timeout does not apply to that wait (#5456).
Seen on the three-broker cluster: kill -9 of the coordinator's broker stopped the agent
until the watchdog re-executed the process, about 60 s with no delivery.

So the call runs on a worker thread and is waited for at most ``offsets_timeout_s``. Past
that, :class:`TxnProducer` abandons the producer -- its worker stays blocked inside
librdkafka and keeps the old instance alive -- and initialises a new one with the same
``transactional.id``: the coordinator bumps the producer epoch, aborts the old producer's
open transaction and fences it, so nothing it still holds can ever commit. The batch counts
as aborted; the caller rewinds its consumer to the committed offsets. The consumer keeps its
group membership: no rebalance, no process restart. The new producer's first offset send
looks the coordinator up afresh.

After ``max_abandoned`` abandoned producers the process restarts in place instead (each
holds a thread and a librdkafka instance until the process ends).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from postbacks.kafka.clients import make_transactional_producer, transactional_config
from postbacks.kafka.watchdog import restart_in_place
from postbacks.metrics import PRODUCERS_REPLACED
from postbacks.settings import Settings

__all__ = ["OFFSETS_TIMEOUT_S", "TxnProducer", "retrying"]

log = logging.getLogger(__name__)

OFFSETS_TIMEOUT_S = 10.0  # an offset send normally takes milliseconds
_INIT_S = 60.0  # how long a replacement may take to initialise, across retriable errors


class TxnProducer:
    """One stage's transactional producer (``.producer``), replaceable when stuck.

    ``first``: the producer to start with, transactions initialised; ``make`` builds an
    uninitialised one with the same ``transactional.id`` for a replacement; ``restart`` is
    what happens past ``max_abandoned`` (tests pass their own)."""

    def __init__(self, first: Producer, make: Callable[[], Producer], stage: str, *,
                 offsets_timeout_s: float = OFFSETS_TIMEOUT_S, max_abandoned: int = 3,
                 restart: Callable[[str], None] = restart_in_place) -> None:
        self.producer = first
        self._make = make
        self.stage = stage
        self.offsets_timeout_s = offsets_timeout_s
        self.max_abandoned = max_abandoned
        self._restart = restart
        self.abandoned: list[Producer] = []

    @classmethod
    def create(cls, settings: Settings, stage: str, **kw: Any) -> TxnProducer:
        """The stage's producer (a clear error when the broker has no transactions)."""
        return cls(make_transactional_producer(settings, stage),
                   lambda: Producer(transactional_config(settings, stage)), stage, **kw)

    def _init(self, deadline: float) -> Producer:
        producer = self._make()
        retrying(f"{self.stage}: init_transactions", lambda: producer.init_transactions(
            max(1.0, min(30.0, deadline - time.monotonic()))), deadline)
        return producer

    def send_offsets(self, positions: list[TopicPartition], group_metadata: object) -> bool:
        """``send_offsets_to_transaction``, bounded. True: sent (errors raise as from the
        call itself). False: it hung; the producer was replaced and the transaction is gone
        -- rewind and redo the batch."""
        done: Future[None] = Future()
        producer = self.producer

        def call() -> None:
            try:
                producer.send_offsets_to_transaction(positions, group_metadata,
                                                     self.offsets_timeout_s)
                done.set_result(None)
            except BaseException as exc:  # handed to the waiting thread
                done.set_exception(exc)

        # A daemon thread of its own per call: a hung one must not hold up the process's
        # exit (an executor's threads are joined at exit), and starting one costs far less
        # than the transaction it belongs to.
        threading.Thread(target=call, name=f"{self.stage}-send-offsets", daemon=True).start()
        try:
            done.result(timeout=self.offsets_timeout_s)
            return True
        except TimeoutError:
            pass
        self._replace(f"send_offsets_to_transaction has not returned for "
                      f"{self.offsets_timeout_s:g} s")
        return False

    def _replace(self, why: str) -> None:
        PRODUCERS_REPLACED.labels(stage=self.stage).inc()
        self.abandoned.append(self.producer)
        if len(self.abandoned) > self.max_abandoned:
            self._restart(f"{self.stage}: {why}, {len(self.abandoned)} producers abandoned")
        log.warning("%s: %s: a new transactional producer replaces it (its transaction is "
                    "aborted; the batch is read again)", self.stage, why)
        self.producer = self._init(time.monotonic() + _INIT_S)


def retrying(what: str, call: Callable[[], object], deadline: float) -> None:
    """Call a transactional API, repeating it while Kafka says the error is retriable (a
    broker restart, a coordinator moving) until ``deadline``; other errors propagate."""
    while True:
        try:
            call()
            return
        except KafkaException as exc:
            kerr = exc.args[0] if exc.args else None
            if (isinstance(kerr, KafkaError) and kerr.retriable()
                    and not kerr.txn_requires_abort() and time.monotonic() < deadline):
                log.warning("%s: retriable error, retrying: %s", what, kerr)
                time.sleep(0.5)
                continue
            raise
