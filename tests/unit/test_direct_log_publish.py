"""Breaker transitions are published without waiting. One the producer's queue had no room
for, or the broker did not store, was dropped with a log line: a restarted agent, or
another one, then sent to an endpoint whose breaker was open here. It is kept (the latest
per endpoint) and produced again; a later transition of the endpoint supersedes it."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError

from postbacks.settings import load_settings
from streams.intents import DirectLog


class Producer:
    def __init__(self) -> None:
        self.full = False
        self.fail_next = 0  # the broker refuses this many of the next deliveries
        self.reports: list[tuple[Any, KafkaError | None]] = []
        self.stored: list[tuple[bytes | None, bytes]] = []

    def produce(self, _topic: str, value: bytes, key: bytes | None,
                on_delivery: Any = None) -> None:
        if self.full:
            raise BufferError("queue full")
        err = None
        if self.fail_next:
            self.fail_next -= 1
            err = KafkaError(KafkaError._MSG_TIMED_OUT, "message timed out")
        else:
            self.stored.append((key, value))
        self.reports.append((on_delivery, err))

    def poll(self, _timeout: float) -> int:
        reports, self.reports = self.reports, []
        for report, err in reports:
            report(err, None)
        return 0


def _log() -> tuple[DirectLog, Producer]:
    p = Producer()
    return DirectLog(load_settings(), producer=p), p  # type: ignore[arg-type]


def test_a_transition_the_queue_had_no_room_for_is_produced_later() -> None:
    log, p = _log()
    p.full = True
    log.publish("breakers.v1", b"ep_1", b"open")
    assert p.stored == []
    p.full = False
    log.retry_pending()
    assert p.stored == [(b"ep_1", b"open")]


def test_one_the_broker_did_not_store_is_produced_again() -> None:
    log, p = _log()
    p.fail_next = 1
    log.publish("breakers.v1", b"ep_1", b"open")
    log.retry_pending()  # its failed report, served: kept again
    log.retry_pending()  # produced again
    assert p.stored == [(b"ep_1", b"open")]
    log.retry_pending()
    assert p.stored == [(b"ep_1", b"open")]  # once stored, not again


def test_a_later_transition_supersedes_one_not_stored() -> None:
    log, p = _log()
    p.fail_next = 1
    log.publish("breakers.v1", b"ep_1", b"open")
    log.publish("breakers.v1", b"ep_1", b"half_open")  # before the failure is reported
    log.retry_pending()
    log.retry_pending()
    assert p.stored == [(b"ep_1", b"half_open")]  # the old one is not produced again
