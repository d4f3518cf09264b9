"""``postbacks anomaly calibrate`` on a history stored in PostgreSQL's deliveries: a
threshold too low trips on the history's own noise; the recommendation, applied with
``--apply`` (audited), re-runs with zero trips and zero held on the same history, and a
labelled incident in it still trips within minutes."""

from __future__ import annotations

import json
import math
import random
import zlib
from datetime import UTC, datetime
from pathlib import Path

import pytest

from postbacks.db.anomaly import load_rows, set_mode
from postbacks.db.connect import connect
from postbacks.settings import Settings
from tests.integration.anomaly_helpers import audit_rows, run_cli

USD = 1_000_000
MIN = 60_000
WEEK = 7 * 1440 * MIN


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def _insert_history(settings: Settings, ns: str, t0: int, weeks: int,
                    surge: tuple[int, int]) -> int:
    """Deliveries rows as the sink writes them, ~6 a minute with a diurnal swing and
    lognormal payouts; x3 within ``surge`` (epoch ms). Returns the rows written."""
    rng = random.Random(zlib.crc32(ns.encode()))
    rows = 0
    with connect(settings.database_url) as conn, conn.cursor() as cur:
        with cur.copy("COPY deliveries (delivery_id, endpoint_id, app_id, conversion_id,"
                      " event_type, event_id, idempotency_key, payout_usd_micros, snapshot,"
                      " created_at) FROM STDIN") as cp:
            for i in range(weeks * 7 * 1440):
                at = t0 + i * MIN
                lam = 6 * (1 + 0.5 * math.sin(2 * math.pi * (i % 1440) / 1440))
                if surge[0] <= at < surge[1]:
                    lam *= 3
                for _ in range(sum(1 for _ in range(40) if rng.random() < lam / 40)):
                    rows += 1
                    pay = int(rng.lognormvariate(0.7, 0.8) * USD)
                    occurred = at + rng.randrange(MIN)
                    snap = {"occurred_at": occurred, "payout_usd_micros": pay}
                    cp.write_row((f"cal_{ns}_{rows}", f"ep_{ns}", f"app_{ns}", f"cv_{ns}_{rows}",
                                  "purchase", f"evt_{ns}_{rows}", f"msg_{ns}_{rows}", pay,
                                  json.dumps(snap), _iso(occurred)))
        conn.commit()
    return rows


@pytest.fixture()
def history(settings: Settings, namespace: str):  # type: ignore[no-untyped-def]
    # a four-week slot of its own in the past: the database is shared with other tests
    slot = zlib.crc32(namespace.encode()) % 500
    t0 = int(datetime(2000, 1, 3, tzinfo=UTC).timestamp() * 1000) + slot * 5 * WEEK
    surge = (t0 + 3 * WEEK + 5 * 24 * 60 * MIN + 10 * 60 * MIN, 0)
    surge = (surge[0], surge[0] + 6 * 60 * MIN)
    n = _insert_history(settings, namespace, t0, 4, surge)
    yield t0, t0 + 4 * WEEK, surge, n
    with connect(settings.database_url) as conn:
        conn.execute("DELETE FROM deliveries WHERE delivery_id LIKE %s", (f"cal_{namespace}_%",))
        conn.commit()


def _global_k(settings: Settings) -> float | None:
    with connect(settings.database_url) as conn:
        for r in load_rows(conn):
            if (r.scope, r.scope_key, r.detector) == ("global", settings.anomaly_global_key,
                                                       "value_rate"):
                k = r.params.get("k")
                return None if k is None else float(k)
    return None


def test_recommendation_applied_then_rerun_holds_nothing_and_the_incident_trips(
    settings: Settings, history: tuple[int, int, tuple[int, int], int],
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    since, until, surge, rows = history
    assert rows > 200_000
    with connect(settings.database_url) as conn:
        set_mode(conn, scope="global", scope_key=settings.anomaly_global_key,
                 detector="value_rate", mode="enforce", params={"k": 0.5, "h": 1.0},
                 actor="test")
        conn.commit()
    window = ["--from", _iso(since), "--to", _iso(until), "--quiet"]
    incident = ["--incident-start", _iso(surge[0]), "--incident-end", _iso(surge[1])]

    assert run_cli(monkeypatch, settings, "anomaly", "calibrate", *window, *incident,
                   "--json") == 0
    out = capsys.readouterr().out
    assert "history: PostgreSQL deliveries" in out
    report = json.loads(out[out.index("\n{") + 1:out.rindex("}") + 1])
    assert report["current"]["k"] == 0.5
    assert sum(d["trips"] for d in report["days"]) > 0  # k 0.5 trips on noise
    assert sum(d["held_micros"] for d in report["days"]) > 0
    rec_k, rec_h = report["recommended"]["k"], report["recommended"]["cusum_h"]
    assert rec_k >= 3.0 and rec_k >= report["needed"]["k"] + 0.5 - 0.01
    assert report["current"]["cusum_h"] == 1.0 and report["needed_h"] is not None
    assert rec_h >= 8.0 and rec_h >= report["needed_h"]["k"] + 2.0 - 0.01
    assert "with it: 0 trips outside the incident" in out
    assert "(not applied" in out
    assert _global_k(settings) == 0.5  # nothing written without --apply

    assert run_cli(monkeypatch, settings, "anomaly", "calibrate", *window, *incident,
                   "--apply", "--actor", "alice", "--note", "4 weeks") == 0
    out = capsys.readouterr().out
    assert "applied:" in out and "mode enforce" in out
    assert _global_k(settings) == rec_k
    audit = audit_rows(settings, [f"global/{settings.anomaly_global_key}/value_rate"])
    assert audit[-1]["actor"] == "alice" and audit[-1]["note"] == "4 weeks"
    assert audit[-1]["after"]["params"]["k"] == rec_k
    assert audit[-1]["after"]["params"]["h"] == rec_h

    # re-run on its own history with what was applied: nothing trips, nothing held outside
    # the incident, and the incident (x3 for 6 h) trips within minutes of its start
    assert run_cli(monkeypatch, settings, "anomaly", "calibrate", *window, *incident,
                   "--json") == 0
    out = capsys.readouterr().out
    report = json.loads(out[out.index("\n{") + 1:out.rindex("}") + 1])
    assert (report["current"]["k"], report["current"]["cusum_h"]) == (rec_k, rec_h)
    before = [d for d in report["days"] if d["day"] < _iso(surge[0])[:10]]
    assert before and sum(d["trips"] + d["held_count"] for d in before) == 0
    tripped = report["incident_trip_ms"]["current"]
    assert tripped is not None and tripped - surge[0] <= 15 * MIN, (tripped, surge)
    print(f"\n{rows:,} deliveries over 4 weeks; k 0.5 tripped; recommended k {rec_k} "
          f"(highest score {report['needed']['k']:.2f}); re-run: 0 trips before the "
          f"incident, which tripped {(tripped - surge[0]) / MIN:.0f} min after its start")


def test_bad_arguments_and_an_empty_range_get_clear_errors(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_cli(monkeypatch, settings, "anomaly", "calibrate", "--from", "yesterday") == 2
    assert "--from" in capsys.readouterr().err
    assert run_cli(monkeypatch, settings, "anomaly", "calibrate", "--apply") == 2
    assert "--actor" in capsys.readouterr().err
    assert run_cli(monkeypatch, settings, "anomaly", "calibrate", "--incident-start",
                   "2001-01-01T00:00Z") == 2
    assert "go together" in capsys.readouterr().err
    assert run_cli(monkeypatch, settings, "anomaly", "calibrate", "--from",
                   "1971-01-01T00:00Z", "--to", "1971-01-02T00:00Z", "--quiet") == 1
    assert "no payouts" in capsys.readouterr().err


def test_from_the_deliveries_topic_by_time_range(
    settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--topic``: the deliveries produced in [--from, --to), bucketed by the conversion's
    event time; a record before --from is left out, an undecodable one is skipped."""
    import time

    from confluent_kafka import Producer

    from postbacks.codec import codec_for
    from tests.unit.factories import make_conversion, make_delivery
    from topics import TOPICS

    topic = settings.topic(TOPICS.deliveries.base)
    codec = codec_for("Delivery")
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers})
    base = int(datetime(2003, 5, 5, 12, 0, tzinfo=UTC).timestamp() * 1000)

    def send(n: int, payout: int, minute: int) -> None:
        conv = make_conversion(event_id=f"evt_{namespace}_{n}",
                               conversion_id=f"cv_{namespace}_{n}", app_id=f"app_{namespace}",
                               occurred_at=base + minute * MIN, payout_usd_micros=payout)
        d = make_delivery(delivery_id=f"dlv_{namespace}_{n}", endpoint_id=f"ep_{namespace}",
                          conversion=conv, created_at=base + minute * MIN)
        p.produce(topic, codec.encode(d), f"ep_{namespace}".encode())

    send(1, 1_000 * USD, 0)  # before the range
    assert p.flush(30) == 0
    time.sleep(1.5)
    start = int(time.time() * 1000)
    send(2, 2 * USD, 0)
    send(3, 3 * USD, 0)
    p.produce(topic, b"\x00not avro", f"ep_{namespace}".encode())
    send(4, 4 * USD, 1441)  # the next day
    assert p.flush(30) == 0
    assert run_cli(monkeypatch, settings, "anomaly", "calibrate", "--topic", "--from",
                   _iso(start), "--quiet", "--json") == 0
    out = capsys.readouterr().out
    assert "history: topic deliveries.v1" in out
    report = json.loads(out[out.index("\n{") + 1:out.rindex("}") + 1])
    days = {d["day"]: (d["payout_micros"], d["count"]) for d in report["days"]}
    assert days == {"2003-05-05": (5 * USD, 2), "2003-05-06": (4 * USD, 1)}


def test_from_a_file_of_conversions_with_iso_and_epoch_times(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = [
        {"conversion_id": "a", "occurred_at": "2004-02-02T10:00:30+02:00",
         "payout_usd_micros": 2 * USD},
        {"conversion_id": "b", "occurred_at": 1075708830000, "payout_usd_micros": 3 * USD},
        {"conversion_id": "c", "occurred_at": "yesterday", "payout_usd_micros": 9 * USD},
        {"conversion_id": "d", "occurred_at": 1075708830000, "payout_usd_micros": None},
    ]
    f = tmp_path / "h.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert run_cli(monkeypatch, settings, "anomaly", "calibrate", "--file", str(f), "--from",
                   "2004-01-01T00:00Z", "--to", "2004-03-01T00:00Z", "--quiet", "--json") == 0
    out = capsys.readouterr().out
    report = json.loads(out[out.index("\n{") + 1:out.rindex("}") + 1])
    assert [(d["day"], d["payout_micros"], d["count"], d["minutes"]) for d in report["days"]] \
        == [("2004-02-02", 5 * USD, 2, 1)]  # 08:00:30Z both; the unusable two left out
