"""The ids the product's producers give the broker (docs/operators.md, "Kafka client ids"):
each client's configuration captured where it is handed to the Kafka library."""

from __future__ import annotations

from typing import Any

import pytest

from postbacks.settings import load_settings


class _Captured(Exception):
    pass


def test_the_agents_direct_producer_and_the_conversion_producer_name_themselves(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import postbacks.kafka.clients as clients
    from postbacks.emit import ConversionProducer
    from streams.intents import DirectLog

    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(clients, "Producer", lambda conf: seen.append(conf) or object())
    settings = load_settings({"POSTBACKS_TOPIC_PREFIX": "t."})
    DirectLog(settings)
    ConversionProducer(settings)
    assert [c["client.id"] for c in seen] == ["postbacks-agent-direct", "postbacks-emit"]


def test_every_console_publisher_shares_one_client_id(monkeypatch: pytest.MonkeyPatch) -> None:
    import postbacks.kafka.publish as publish

    made: list[tuple[str, str | None]] = []

    def producer(_settings: object, stage: str, client: str | None = None) -> object:
        made.append((stage, client))
        raise _Captured

    monkeypatch.setattr(publish, "make_transactional_producer", producer)
    for _ in range(2):
        with pytest.raises(_Captured):
            publish.TransactionalPublisher(load_settings({}), "console-replay").publish(
                [("dispatch.v1", b"k", b"v")])
    (stage1, client1), (stage2, client2) = made
    assert stage1 != stage2  # a transactional id of its own: publishers never fence each other
    assert client1 == client2 == "console-replay"
