"""Containment through Kafka, the I/O part: deliveries straight onto deliveries.v1 (keyed by
endpoint, as fan-out writes them), the gate's dispatch.v1 and held.v1 read back, and the
global scope's row in PostgreSQL (arm, read the trip, close the halt as an operator does).

Delivery ids carry what a delivery is: ``dlv_n<minute>_<i>`` normal traffic,
``dlv_c<shape>_<i>`` a cohort's (its campaign is in the conversion's ``source_snapshot``).
"""

from __future__ import annotations

import re
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer

from bench.harness import send_record
from postbacks.codec import codec_for
from postbacks.core.anomaly.retro_burst import SUGGESTED_COUNT
from postbacks.db.anomaly import close_halt, set_mode
from postbacks.db.connect import connect
from postbacks.settings import Settings
from postbacks.tools.procs import metrics_page
from streams.anomaly_gate.admin import publish_state
from tests.unit.factories import make_conversion, make_delivery
from topics import TOPICS

RETRO_MS = 30 * 86_400_000  # completed 30 days before created: past the 7-day window


def progress(msg: str) -> None:
    print(f"[containment] {msg}", file=sys.stderr, flush=True)


def arm(s: Settings, burst: bool = True) -> None:
    """Global value rate at enforce (this run's global key), and the retrodating guard at
    enforce for every endpoint: through the global retrodating row, with the retrodated
    burst at its suggested count (50), or (``burst`` False) through the endpoint
    row keyed ``*``, the value rate alone halting the global scope."""
    with connect(s.database_url) as conn:
        set_mode(conn, scope="global", scope_key=s.anomaly_global_key, detector="value_rate",
                 mode="enforce", actor="bench", note="containment bench")
        if burst:
            set_mode(conn, scope="global", scope_key=s.anomaly_global_key,
                     detector="retrodating", mode="enforce",
                     params={"burst_count": SUGGESTED_COUNT}, actor="bench",
                     note="containment bench: the guard everywhere, and the burst")
        else:
            set_mode(conn, scope="endpoint", scope_key="*", detector="retrodating",
                     mode="enforce", actor="bench", note="containment bench: every endpoint")
        conn.commit()


def global_state(s: Settings) -> tuple[str, str | None]:
    """The global scope: tripped (and why) when any of its rows is."""
    with connect(s.database_url) as conn:
        rows = conn.execute("SELECT state, state_reason FROM payout_anomaly_settings WHERE"
                            " scope = 'global' AND scope_key = %s ORDER BY state DESC,"
                            " state_changed_at", (s.anomaly_global_key,)).fetchall()
    tripped = [r for r in rows if r[0] == "tripped"]
    return ("tripped", tripped[0][1]) if tripped else ("closed", None)


def watermark_reader(gate_log: Path) -> Callable[[], int | None]:
    """Reads the gate's ``postbacks_anomaly_global_watermark_seconds`` (ms; None unset)."""
    def read() -> int | None:
        page = metrics_page(gate_log)
        got = re.search(r"^postbacks_anomaly_global_watermark_seconds (\S+)$", page or "", re.M)
        return None if got is None or float(got.group(1)) <= 0 else int(float(got.group(1)) * 1000)
    return read


def wait_watermark(read: Callable[[], int | None], at_least_ms: int,
                   timeout: float = 120.0) -> bool:
    """Until the global roll-up's watermark is at ``at_least_ms`` or later (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = read()
        if got is not None and got >= at_least_ms:
            return True
        time.sleep(0.2)
    progress(f"  the global roll-up did not reach {at_least_ms} within {timeout:.0f} s "
             f"(at {read()})")
    return False


def close_global(s: Settings) -> None:
    """``postbacks anomaly close --scope global``: closed in PostgreSQL once the control
    topic has acknowledged the closed state."""
    with connect(s.database_url) as conn, conn.transaction():
        tripped = [r[0] for r in conn.execute(
            "SELECT detector FROM payout_anomaly_settings WHERE scope = 'global' AND"
            " scope_key = %s AND state = 'tripped'", (s.anomaly_global_key,))]
        for detector in tripped:
            row = close_halt(conn, scope="global", scope_key=s.anomaly_global_key,
                             detector=detector, actor="bench-operator",
                             note="containment bench: cohort over, resume")
            publish_state(s, row, actor="bench-operator")


class Feed:
    def __init__(self, s: Settings) -> None:
        self.s = s
        self.codec = codec_for("Delivery")
        self.topic = s.topic(TOPICS.deliveries.base)
        self.p = Producer({"bootstrap.servers": s.kafka_bootstrap_servers, "linger.ms": 20,
                           "partitioner": "murmur2_random", "compression.type": "lz4",
                           "enable.idempotence": True})
        self.c = Consumer({"bootstrap.servers": s.kafka_bootstrap_servers,
                           "group.id": f"bench-containment-{uuid.uuid4().hex[:8]}",
                           "auto.offset.reset": "earliest", "enable.auto.commit": False})
        self.c.subscribe([s.topic(TOPICS.dispatch.base), s.topic(TOPICS.held.base)])
        self.held_topic = s.topic(TOPICS.held.base)
        self.sent = 0
        self.outputs = 0
        self.normal_held: list[tuple[int, str]] = []  # (minute, hold reason)
        self.cohort: dict[str, str] = {}  # delivery id -> "dispatched" | hold reason
        self.first_global_hold: int | None = None  # occurred_at of the first halted_global

    def send(self, did: str, endpoint: str, at: int, payout: int, *, retro: bool = False,
             snapshot: dict[str, str] | None = None) -> None:
        conv = make_conversion(event_id=f"e{did[4:]}", conversion_id=f"cv{did[4:]}",
                               app_id=f"app_{endpoint}", occurred_at=at,
                               source_created_at=at,
                               source_completed_at=at - (RETRO_MS if retro else 60_000),
                               payout_usd_micros=payout, source_snapshot=snapshot or {})
        d = make_delivery(delivery_id=did, endpoint_id=endpoint, idempotency_key=did,
                          conversion=conv, created_at=at, enqueued_at=None)
        send_record(self.p, self.topic, self.codec.encode(d), endpoint.encode())
        self.sent += 1
        if self.sent % 5000 == 0:
            self.p.poll(0)

    def flush(self) -> None:
        assert self.p.flush(60) == 0

    def poll(self, timeout: float = 0.05) -> int:
        got = 0
        for m in self.c.consume(5000, timeout=timeout):
            if m.error() is not None:
                continue
            got += 1
            held = m.topic() == self.held_topic
            raw: Any = m.value()
            if not held and b"dlv_c" not in raw:
                continue  # a normal dispatch: counted, not decoded
            d = self.codec.decode(raw)
            did, reason = d["delivery_id"], d.get("hold_reason")
            if held and reason == "halted_global":
                at = d["conversion"]["occurred_at"]
                if self.first_global_hold is None or at < self.first_global_hold:
                    self.first_global_hold = at
            if did.startswith("dlv_c"):
                self.cohort[did] = "dispatched" if not held else str(reason)
            elif held:
                self.normal_held.append((int(did[5:].split("_")[0]), str(reason)))
        self.outputs += got
        return got

    def wait(self, timeout: float = 1800.0, every: float = 15.0) -> float:
        """Until the gate has written an output for every delivery sent; the seconds."""
        self.flush()
        t0 = last = time.monotonic()
        while self.outputs < self.sent:
            if not self.poll(0.2) and time.monotonic() - t0 > timeout:
                raise TimeoutError(f"gate outputs {self.outputs:,} of {self.sent:,}")
            if time.monotonic() - last > every:
                last = time.monotonic()
                progress(f"  gate outputs {self.outputs:,} / {self.sent:,}")
        return time.monotonic() - t0

    def close(self) -> None:
        self.flush()
        self.c.close()
