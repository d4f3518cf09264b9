"""A stage output over the producer's message size, against the real broker: librdkafka
refuses it at produce() (MSG_SIZE_TOO_LARGE), and the stage dead-letters it (``too_large``,
its first bytes kept) instead of failing its batch, and its partition, for ever."""

from __future__ import annotations

from postbacks.codec import codec_for
from postbacks.kafka.clients import make_producer
from postbacks.kafka.stage import produce_or_dead_letter
from postbacks.settings import Settings
from tests.kafka_util import read_topic
from topics import TOPICS


def test_an_output_over_the_message_size_lands_in_the_dead_letter_topic(
        settings: Settings) -> None:
    producer = make_producer(settings)
    retry, dlq = settings.topic(TOPICS.retry[0].base), settings.topic(TOPICS.dlq.base)
    big = b"y" * 1_200_000  # over librdkafka's message.max.bytes (1,000,000)
    produce_or_dead_letter(producer, "agent", retry, dlq, b"ep_1", big)
    assert producer.flush(30) == 0
    [msg] = read_topic(settings, TOPICS.dlq.base, 1)
    dl = codec_for("DeadLetter").decode(msg.value())
    assert (dl["reason"], dl["stage"], dl["origin_topic"]) == ("too_large", "agent", retry)
    assert "1,200,000 bytes" in dl["error_message"] and msg.key() == b"ep_1"
    assert (dl["original_value"] or b"").startswith(b"yyyy")
    assert len(msg.value()) < 1_000_000
