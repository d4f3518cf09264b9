"""A stage commits its output in parts once a batch has made OUTPUT_BUDGET bytes of it,
against the real broker: records fanned out to several large outputs each were all held
until the batch's one commit (hundreds of MiB for a batch of records just under the size
limit), and a stage killed for its memory read the same batch again after every restart.
Every output arrives once, and the input offsets of each part are committed with it."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Message, Producer, TopicPartition

import postbacks.kafka.stage as stage_mod
from postbacks.kafka.clients import make_consumer
from postbacks.kafka.stage import Output, run_stage
from postbacks.kafka.txn import TxnProducer
from postbacks.settings import Settings
from tests.kafka_util import read_topic
from topics import TOPICS

RECORDS = 6
OUT_BYTES = 600_000  # two of these per record: over the budget the test sets


def test_a_batch_whose_output_passes_the_budget_commits_in_parts(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stage_mod, "OUTPUT_BUDGET", 1_000_000)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers})
    for i in range(RECORDS):  # one partition key: one batch, read in order
        producer.produce(settings.topic(TOPICS.conversions.base), f"in-{i}".encode(), b"k")
    assert producer.flush(30) == 0

    def handle(msg: Message, out: Output, _now_ms: int) -> None:
        body = msg.value() or b""
        for part in (b"a", b"b"):
            out.add(TOPICS.deliveries.base, b"k", body + part * OUT_BYTES)

    commits: list[bool] = []
    stop = threading.Event()
    consumer = make_consumer(settings, "budget-test")
    txn = TxnProducer.create(settings, "budget-test")
    worker = threading.Thread(target=run_stage, args=(
        "budget-test", settings, consumer, txn, [TOPICS.conversions.base], handle, stop),
        kwargs={"group": "budget-test", "after_commit": commits.append}, daemon=True)
    worker.start()
    try:
        deadline = time.monotonic() + 60
        while len(commits) < RECORDS and time.monotonic() < deadline and worker.is_alive():
            time.sleep(0.05)
    finally:
        stop.set()
        worker.join(30)
    # each record's two outputs (1.2 MB) pass the 1 MB budget: one transaction apiece,
    # however the records were batched
    assert commits == [True] * RECORDS, commits
    got = read_topic(settings, TOPICS.deliveries.base, 2 * RECORDS)
    assert sorted(m.value()[:4] + m.value()[-1:] for m in got) == sorted(
        f"in-{i}".encode() + p for i in range(RECORDS) for p in (b"a", b"b"))
    check = make_consumer(settings, "budget-test")
    try:
        topic = settings.topic(TOPICS.conversions.base)
        parts = check.committed([TopicPartition(topic, p)
                                 for p in range(TOPICS.conversions.partitions)], timeout=30)
    finally:
        check.close()
    assert sum(max(tp.offset, 0) for tp in parts) == RECORDS
