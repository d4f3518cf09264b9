"""TxnProducer: a hung offset send abandons the producer and initialises a new one.

The producers here are stand-ins with the three calls TxnProducer makes; the real hang
(librdkafka waiting for a decommissioned coordinator) is shown against a three-broker
cluster in tests/e2e/test_cluster_broker_kill.py."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from postbacks.kafka.txn import TxnProducer


class FakeProducer:
    def __init__(self, *, hang: bool = False, fail: KafkaException | None = None,
                 init_errors: int = 0) -> None:
        self.hang, self.fail, self.init_errors = hang, fail, init_errors
        self.inits = 0
        self.sent: list[object] = []
        self.release = threading.Event()

    def init_transactions(self, timeout: float) -> None:
        self.inits += 1
        if self.inits <= self.init_errors:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "coordinator moving",
                                            retriable=True))

    def send_offsets_to_transaction(self, positions: object, metadata: object,
                                    timeout: float) -> None:
        if self.hang:
            self.release.wait(30)
        if self.fail is not None:
            raise self.fail
        self.sent.append(positions)


def _txn(first: FakeProducer, made: list[FakeProducer], restarts: list[str],
         **kw: object) -> TxnProducer:
    def make() -> FakeProducer:
        p = FakeProducer()
        made.append(p)
        return p

    return TxnProducer(first, make, "agent", offsets_timeout_s=0.2,  # type: ignore[arg-type]
                       restart=restarts.append, **kw)  # type: ignore[arg-type]


def test_a_send_that_returns_keeps_the_producer() -> None:
    first, made, restarts = FakeProducer(), [], []  # type: ignore[var-annotated]
    txn = _txn(first, made, restarts)
    assert txn.send_offsets(["p0"], object()) is True  # type: ignore[list-item]
    assert txn.producer is first and first.sent == [["p0"]] and made == []


def test_a_send_that_hangs_is_abandoned_and_a_new_producer_initialised() -> None:
    first, made, restarts = FakeProducer(hang=True), [], []  # type: ignore[var-annotated]
    txn = _txn(first, made, restarts)
    t0 = time.monotonic()
    assert txn.send_offsets(["p0"], object()) is False  # type: ignore[list-item]
    assert 0.2 <= time.monotonic() - t0 < 5
    assert len(made) == 1 and txn.producer is made[0] and made[0].inits == 1
    assert txn.abandoned == [first] and restarts == []
    # the new producer sends normally
    assert txn.send_offsets(["p1"], object()) is True  # type: ignore[list-item]
    assert made[0].sent == [["p1"]]
    first.release.set()


def test_an_error_from_the_send_is_raised_as_before() -> None:
    err = KafkaException(KafkaError(KafkaError._STATE, "abortable"))
    first, made, restarts = FakeProducer(fail=err), [], []  # type: ignore[var-annotated]
    txn = _txn(first, made, restarts)
    with pytest.raises(KafkaException):
        txn.send_offsets(["p0"], object())  # type: ignore[list-item]
    assert txn.producer is first and made == []


def test_the_replacement_retries_a_retriable_init_error() -> None:
    first, restarts = FakeProducer(hang=True), []  # type: ignore[var-annotated]
    second = FakeProducer(init_errors=2)
    txn = TxnProducer(first, lambda: second, "relay",  # type: ignore[arg-type]
                      offsets_timeout_s=0.2, restart=restarts.append)
    assert txn.send_offsets([], object()) is False
    assert txn.producer is second and second.inits == 3
    first.release.set()


def test_past_max_abandoned_the_process_restarts() -> None:
    made, restarts = [], []  # type: ignore[var-annotated]

    def make() -> FakeProducer:
        p = FakeProducer(hang=True)
        made.append(p)
        return p

    first = FakeProducer(hang=True)
    txn = TxnProducer(first, make, "fanout", offsets_timeout_s=0.1,  # type: ignore[arg-type]
                      max_abandoned=2, restart=restarts.append)
    for _ in range(2):
        assert txn.send_offsets([], object()) is False
    assert restarts == []
    assert txn.send_offsets([], object()) is False
    assert len(restarts) == 1 and "3 producers abandoned" in restarts[0]
    for p in (first, *made):
        p.release.set()
