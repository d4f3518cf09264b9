"""Helpers for the anomaly-admin and held-CLI tests: run the CLI in-process, seed held
deliveries straight into PostgreSQL, read audit rows and topic sizes."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from psycopg.types.json import Jsonb

from postbacks.cli import main
from postbacks.db.connect import connect
from postbacks.records import DeliveryRecord
from postbacks.settings import Settings
from sinks.tables import TABLES, ts_from_ms
from tests.unit.factories import make_conversion, make_delivery


def run_cli(monkeypatch: pytest.MonkeyPatch, settings: Settings, *argv: str) -> int:
    """``postbacks <argv>`` in this process with the test's settings in the environment."""
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers,
        "POSTBACKS_DATABASE_URL": settings.database_url,
        "POSTBACKS_TOPIC_PREFIX": settings.topic_prefix,
        "POSTBACKS_INSTANCE_ID": settings.instance_id,
        "POSTBACKS_ANOMALY_GLOBAL_KEY": settings.anomaly_global_key,
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    code = exc.value.code
    return code if isinstance(code, int) else 1


def held_delivery(ns: str, n: int, *, endpoint: str, app: str | None = None,
                  payout: int = 1_250_000, attempt: int = 0) -> DeliveryRecord:
    now = int(time.time() * 1000)
    conv = make_conversion(
        event_id=f"evt_{ns}_{n}", conversion_id=f"cv_{ns}_{n}", app_id=app or f"app_{ns}",
        payout_usd_micros=payout, occurred_at=now - 60_000, source_created_at=now - 60_000,
        source_completed_at=now - 120_000,
    )
    return make_delivery(
        delivery_id=f"dlv_{ns}_{n}", endpoint_id=endpoint,
        idempotency_key=f"msg_{ns}_{n}_{uuid.uuid4().hex[:6]}", conversion=conv,
        created_at=now - 30_000, attempt=attempt,
    )


def insert_deliveries(settings: Settings, deliveries: list[DeliveryRecord], *,
                      status: str = "held", reason: str | None = "retrodated",
                      snapshot: dict[str, Any] | None = None) -> None:
    """Rows as the sink writes them (``_delivery_row``), then the status projection."""
    table = TABLES["deliveries"]
    cols = ", ".join(table.columns)
    marks = ", ".join(["%s"] * len(table.columns))
    now = int(time.time() * 1000)
    with connect(settings.database_url) as conn:
        for d in deliveries:
            row = list(table.row(d))
            at = table.columns.index("snapshot")
            row[at] = Jsonb(row[at] if snapshot is None else snapshot)
            conn.execute(f"INSERT INTO deliveries ({cols}) VALUES ({marks})", row)
            conn.execute(
                "UPDATE deliveries SET status = %s, status_at = %s, attempt_count = %s,"
                " held_at = %s, hold_reason = %s WHERE delivery_id = %s",
                (status, ts_from_ms(now), d["attempt"],
                 ts_from_ms(now - 1000) if status == "held" else None,
                 reason if status == "held" else None, d["delivery_id"]),
            )
        conn.commit()


def audit_rows(settings: Settings, target_ids: list[str]) -> list[dict[str, Any]]:
    with connect(settings.database_url) as conn:
        rows = conn.execute(
            "SELECT actor, action, target_type, target_id, before, after, note FROM audit_log"
            " WHERE target_id = ANY(%s) ORDER BY audit_id", (target_ids,),
        ).fetchall()
    names = ("actor", "action", "target_type", "target_id", "before", "after", "note")
    return [dict(zip(names, r, strict=True)) for r in rows]


def topic_size(settings: Settings, base: str) -> int:
    """Sum of high watermarks over a topic's partitions (records + transaction markers)."""
    c = Consumer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                  "group.id": f"wm-{uuid.uuid4().hex[:8]}"})
    topic = settings.topic(base)
    deadline = time.monotonic() + 30
    try:
        while True:  # leaders of freshly created topics may still be moving
            try:
                parts = c.list_topics(topic, timeout=10).topics[topic].partitions
                return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                           for p in parts)
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        c.close()
