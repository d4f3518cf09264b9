"""webhook_dlq_total counts a stage's dead letters once their transaction commits: an
aborted batch is read and dead-lettered again, and must not be counted twice."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from postbacks.kafka.stage import Output, commit_batch
from postbacks.metrics import DLQ_TOTAL, TXN_ABORTS
from postbacks.settings import Settings


def count(stage: str, reason: str) -> float:
    return DLQ_TOTAL.labels(stage=stage, reason=reason)._value.get()  # type: ignore[attr-defined]


class Producer:
    def __init__(self, abort_commit: bool) -> None:
        self.abort_commit = abort_commit
        self.sent: list[tuple[str, bytes | None, bytes | None]] = []
        self.aborted = 0

    def begin_transaction(self) -> None: ...

    def produce(self, topic: str, value: bytes | None, key: bytes | None) -> None:
        if len(value or b"") > 1_000_000:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
        self.sent.append((topic, key, value))

    def poll(self, timeout: float) -> int:
        return 0

    def commit_transaction(self, timeout: float) -> None:
        if self.abort_commit:
            raise KafkaException(KafkaError(KafkaError._STATE, txn_requires_abort=True))

    def abort_transaction(self, timeout: float) -> None:
        self.aborted += 1


class Txn:
    def __init__(self, producer: Producer) -> None:
        self.producer = producer

    def send_offsets(self, positions: list[TopicPartition], metadata: object) -> bool:
        return True


class Consumer:
    def consumer_group_metadata(self) -> object:
        return object()

    def assignment(self) -> list[TopicPartition]:
        return []


def batch() -> Output:
    out = Output()
    out.add("deliveries.v1", b"ep_1", b"ok")
    out.add_dead_letter(b"k", b"letter", "undecodable")
    out.add_dead_letter(b"k", b"letter", "undecodable")
    out.add_dead_letter(None, b"letter", "invalid_record")
    out.add("retry.1m", b"ep_1", b"y" * 1_200_000)  # over the message size: a dead letter
    return out


def run(abort: bool) -> tuple[bool, Producer]:
    p = Producer(abort)
    ok = commit_batch("countstage", Settings(), Consumer(), Txn(p), batch(),  # type: ignore[arg-type]
                      {("conversions.v1", 0): 10}, timeout_s=5)
    return ok, p


def test_an_aborted_batch_counts_no_dead_letter() -> None:
    before = {r: count("countstage", r) for r in ("undecodable", "invalid_record", "too_large")}
    ok, p = run(abort=True)
    assert not ok and p.aborted == 1
    assert {r: count("countstage", r) for r in before} == before


def test_a_committed_batch_counts_each_dead_letter_by_reason() -> None:
    before = {r: count("countstage", r) for r in ("undecodable", "invalid_record", "too_large")}
    ok, p = run(abort=False)
    assert ok
    assert [t for t, _k, _v in p.sent].count("dlq.v1") == 4
    assert {r: count("countstage", r) - before[r] for r in before} == {
        "undecodable": 2, "invalid_record": 1, "too_large": 1}


def test_output_keeps_the_dead_letter_in_order() -> None:
    out = Output()
    out.add("a", None, b"1")
    out.add_dead_letter(b"k", b"2", "undecodable")
    assert out.items == [("a", None, b"1"), ("dlq.v1", b"k", b"2")]
    assert dict(out.dead) == {"undecodable": 1}


class FailedTxnProducer(Producer):
    """librdkafka refuses a produce with _STATE once the transaction has failed (an epoch
    bump after a broker restart, an output the broker refused): neither retriable nor
    marked abortable, it ended the process in place; it is aborted and read again."""

    def produce(self, topic: str, value: bytes | None, key: bytes | None) -> None:
        raise KafkaException(KafkaError(KafkaError._STATE, "transaction has failed"))


def aborts(stage: str, code: str) -> float:
    return TXN_ABORTS.labels(stage=stage, code=code)._value.get()  # type: ignore[attr-defined]


def test_a_produce_refused_because_the_transaction_failed_aborts_it() -> None:
    before = aborts("statestage", "_STATE")
    p = FailedTxnProducer(abort_commit=False)
    ok = commit_batch("statestage", Settings(), Consumer(), Txn(p), batch(),  # type: ignore[arg-type]
                      {("conversions.v1", 0): 10}, timeout_s=5)
    assert not ok and p.aborted == 1
    assert aborts("statestage", "_STATE") == before + 1


def test_every_abort_is_counted_by_stage_and_code() -> None:
    before = aborts("countstage", "_STATE")
    ok, _ = run(abort=True)
    assert not ok
    assert aborts("countstage", "_STATE") == before + 1
