"""Every stage's dead letter fits one message of its producer (postbacks.kafka.stage):
whole when it fits, cut to the first bytes of the original value and key otherwise, and
saying so. The fan-out's end-to-end case is in tests/e2e/test_hostile_upstream.py."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from postbacks.codec import codec_for
from postbacks.errors import DeadLetterError
from postbacks.kafka.stage import dead_letter_for

LIMIT = 100_000
SLACK = 512  # what a Kafka message adds around its key and value, at most


@dataclass
class Msg:
    k: bytes | None
    v: bytes | None

    def topic(self) -> str:
        return "relay.in"

    def partition(self) -> int:
        return 3

    def offset(self) -> int:
        return 41

    def key(self) -> bytes | None:
        return self.k

    def value(self) -> bytes | None:
        return self.v


def _letter(key: bytes | None, value: bytes | None) -> tuple[dict[str, object], int]:
    dl = dead_letter_for(Msg(key, value), "relay",  # type: ignore[arg-type]
                         DeadLetterError("bad record", reason="invalid_record"),
                         "invalid_record", 1_700_000_000_000, limit=LIMIT)
    size = len(dl["original_key"] or b"") + len(codec_for("DeadLetter").encode(dl)) + SLACK
    return dict(dl), size


def test_a_letter_that_fits_keeps_the_original_bytes_whole() -> None:
    key, value = b"ep_1", b"\x01" * (LIMIT - 3_000)
    dl, size = _letter(key, value)
    assert (dl["original_key"], dl["original_value"]) == (key, value)
    assert dl["error_message"] == "bad record"
    assert size <= LIMIT


@pytest.mark.parametrize(("key_len", "value_len"), [
    (4, LIMIT),  # the value alone is over
    (4, LIMIT - 600),  # the value fits, with the letter's own fields it does not
    (LIMIT, 10),  # the key alone is over (the message's key and the letter's copy)
    (LIMIT // 2, LIMIT // 2),
    (3 * LIMIT, 3 * LIMIT),
])
def test_a_letter_too_big_keeps_the_first_bytes_and_says_so(key_len: int,
                                                           value_len: int) -> None:
    key, value = bytes(range(256)) * (key_len // 256 + 1), b"v" * value_len
    key = key[:key_len]
    dl, size = _letter(key, value)
    assert size <= LIMIT
    kept_key, kept_value = dl["original_key"], dl["original_value"]
    assert isinstance(kept_key, bytes) and isinstance(kept_value, bytes)
    assert key.startswith(kept_key) and len(kept_key) == min(key_len, 1024)
    assert value.startswith(kept_value)
    # as much as fits, not a token
    assert len(kept_value) >= min(value_len, LIMIT - 4_000 - len(kept_key))
    message = str(dl["error_message"])
    assert message.startswith("original bytes cut to fit a dead letter: "
                              f"value {value_len:,} bytes, key {key_len:,} bytes")
    assert message.endswith("bad record")


def test_a_record_without_key_or_value_stays_without() -> None:
    dl, _ = _letter(None, None)
    assert dl["original_key"] is None and dl["original_value"] is None
    dl, size = _letter(None, b"x" * (2 * LIMIT))
    assert dl["original_key"] is None and size <= LIMIT
    assert str(dl["error_message"]).startswith("original bytes cut")


class Producer:
    """librdkafka's answers to produce(): the queue full once, then a record over the
    message size refused (MSG_SIZE_TOO_LARGE), as confluent_kafka raises them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.sent: list[tuple[str, bytes | None, bytes | None]] = []
        self.full_once = True

    def produce(self, topic: str, value: bytes | None, key: bytes | None) -> None:
        from confluent_kafka import KafkaError, KafkaException

        if self.full_once:
            self.full_once = False
            raise BufferError("queue full")
        if len(value or b"") + len(key or b"") > self.limit:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
        self.sent.append((topic, key, value))

    def poll(self, timeout: float) -> int:
        return 0


def test_an_output_over_the_message_size_is_dead_lettered_not_fatal() -> None:
    from postbacks.kafka.stage import produce_or_dead_letter

    p = Producer(limit=1_000_000)
    produce_or_dead_letter(p, "agent", "retry.1m", "dlq", b"ep_1", b"x" * 10)
    produce_or_dead_letter(p, "agent", "retry.1m", "dlq", b"ep_1", b"y" * 1_200_000)
    assert p.sent[0] == ("retry.1m", b"ep_1", b"x" * 10)
    topic, key, value = p.sent[1]
    assert topic == "dlq" and key == b"ep_1" and len(value or b"") < 1_000_000
    dl = codec_for("DeadLetter").decode(value)
    assert dl["reason"] == "too_large" and dl["stage"] == "agent"
    assert dl["origin_topic"] == "retry.1m" and "1,200,000 bytes" in dl["error_message"]
    assert (dl["original_value"] or b"").startswith(b"yyyy")


def test_other_produce_errors_still_fail_the_batch() -> None:
    from confluent_kafka import KafkaError, KafkaException

    from postbacks.kafka.stage import produce_or_dead_letter

    class Fenced(Producer):
        def produce(self, topic: str, value: bytes | None, key: bytes | None) -> None:
            raise KafkaException(KafkaError(KafkaError._FENCED))

    with pytest.raises(KafkaException):
        produce_or_dead_letter(Fenced(10), "agent", "t", "dlq", None, b"v")
