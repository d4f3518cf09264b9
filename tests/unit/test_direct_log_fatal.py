"""The agent's direct producer (intents, breaker transitions) in a fatal state refuses every
later produce; the agent restarts rather than dead-letter every later delivery."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from postbacks.kafka import watchdog
from postbacks.settings import load_settings
from streams.intents import DirectLog


class Restarted(Exception):
    pass


class FatalProducer:
    def __init__(self, *, on_produce: bool) -> None:
        self.on_produce = on_produce
        self.reports: list[Any] = []

    def produce(self, topic: str, value: bytes, key: bytes | None, on_delivery: Any = None
                ) -> None:
        err = KafkaError(KafkaError._FATAL, "unclean leader election", fatal=True)
        if self.on_produce:
            raise KafkaException(err)
        self.reports.append((on_delivery, err))

    def poll(self, _timeout: float) -> int:
        for report, err in self.reports:
            report(err, None)
        self.reports.clear()
        return 0


@pytest.mark.parametrize("on_produce", [True, False], ids=["produce", "delivery report"])
def test_a_fatal_producer_restarts_the_agent(monkeypatch: pytest.MonkeyPatch,
                                             on_produce: bool) -> None:
    why: list[str] = []

    def restart(reason: str, **_: Any) -> None:
        why.append(reason)
        raise Restarted

    monkeypatch.setattr(watchdog, "restart_in_place", restart)
    log = DirectLog(load_settings(), producer=FatalProducer(  # type: ignore[arg-type]
        on_produce=on_produce))
    with pytest.raises(Restarted):
        asyncio.run(asyncio.wait_for(log.send("attempts.v1", b"k", b"v"), 5))
    assert len(why) == 1 and "fatal error" in why[0] and "unclean leader" in why[0]
    if on_produce:
        with pytest.raises(Restarted):
            log.publish("breakers.v1", b"k", b"v")
