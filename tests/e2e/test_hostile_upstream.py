"""Hostile and malformed input on conversions.v1 (docs/producers.md is the contract).

Every record below sits on one partition, each followed by a good conversion: a bad record
gets a dead letter whose reason and message name the problem (original bytes kept, or cut
to fit when they are close to the broker's limit, saying so), an odd-but-valid one is
fanned out, and the good record behind each is fanned out too -- no crash, no stall, no
silent drop. The second test runs the stages behind fan-out (gate, sink) on the inputs
that used to stop them: a NUL character and a long id (the sink failed on the row after
every restart), a payout near 2^63 (the gate's per-minute sum overflowed its Avro long and
the gate restarted without end), an ``occurred_at`` far in the future (the gate counted
every later payout of the partition in that future minute). The third puts deliveries
with such values straight onto ``deliveries.v1``, past the fan-out's checks, as another
producer could: the gate does not count them, and holds them under enforce, naming the
field.
"""

from __future__ import annotations

import copy
import io
import os
import re
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import fastavro
from confluent_kafka import KafkaError, Message, Producer
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

from postbacks.codec import MAGIC, codec_for, load_schema_versions
from postbacks.db.anomaly import set_mode
from postbacks.db.connect import connect
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, wait_for
from postbacks.tools.seed import app_id_for, seed_endpoints
from tests.e2e.gate_util import GateFeed
from tests.e2e.harness import dead_letters_counted, metrics_target
from tests.kafka_util import decode, read_topic, scalar
from tests.unit.factories import make_conversion, make_delivery
from topics import TOPICS

_CONV = codec_for("ConversionEvent")
_FP = _CONV.writer.fingerprint
DAY_MS = 86_400_000
BROKER_MAX = 1_048_588  # the broker's message.max.bytes (Kafka's default)
GOOD_PAYOUT = 1_250_000


@dataclass
class Case:
    name: str
    value: bytes | None
    key: bytes | None = b"k"
    # expected: a dead letter (reason, words in its message) or None: fanned out
    reason: str | None = None
    words: tuple[str, ...] = ()
    cut: bool = False  # the dead letter's original bytes are cut to fit
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)


class Upstream:
    """Conversions of one app, encoded as an upstream producer would (or would not)."""

    def __init__(self, app: str, now: int) -> None:
        self.app, self.now = app, now

    def event(self, cid: str, **over: Any) -> dict[str, Any]:
        base: dict[str, Any] = dict(
            event_id=f"evt_{cid}", conversion_id=cid, app_id=self.app, occurred_at=self.now,
            source_created_at=self.now - 1000, source_completed_at=self.now - 2000)
        return dict(make_conversion(**{**base, **over}))

    def enc(self, cid: str, **over: Any) -> bytes:
        return _CONV.encode(self.event(cid, **over))

    def with_raw_conversion_id(self, raw: bytes) -> bytes:
        """A record whose conversion_id bytes are ``raw`` (not necessarily UTF-8)."""
        marker = b"cv_MARKER_0123"
        value = self.enc(marker.decode())
        at = value.index(bytes([2 * len(marker)]) + marker)
        return value[:at] + bytes([2 * len(raw)]) + raw + value[at + 1 + len(marker):]

    def variant(self, cid: str, types: dict[str, Any], *, lie: bool, **over: Any) -> bytes:
        """Encoded with our schema but some fields' types changed; framed with that
        schema's own fingerprint, or (``lie``) with ours."""
        schema = copy.deepcopy(_CONV.writer.schema)
        for f in schema["fields"]:
            f["type"] = types.get(f["name"], f["type"])
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parse_schema(schema), self.event(cid, **over))
        fp = _FP
        if not lie:
            canonical = to_parsing_canonical_form(parse_schema(schema, _write_hint=False))
            fp = int.from_bytes(bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")), "little")
        return MAGIC + fp.to_bytes(8, "little") + buf.getvalue()

    def older_writer(self, cid: str) -> bytes:
        old = load_schema_versions()["ConversionEvent"][0]
        names = {f["name"] for f in old.parsed["fields"]}
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, old.parsed,
                                   {k: v for k, v in self.event(cid).items() if k in names})
        return MAGIC + old.fingerprint.to_bytes(8, "little") + buf.getvalue()


def _big_snapshot(total: int) -> dict[str, str]:
    """About ``total`` bytes of incompressible snapshot."""
    return {f"f{i}": os.urandom(250).hex() for i in range(total // 506)}


def _produce(settings: Settings, records: list[tuple[bytes | None, bytes | None,
                                                      list[tuple[str, bytes | None]]]],
             ) -> list[int]:
    """Produce to partition 0 of conversions.v1, in order; the offsets, in order. Up to the
    broker's own limit (librdkafka's default is lower), as another client may."""
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                         "enable.idempotence": True, "linger.ms": 5,
                         "message.max.bytes": BROKER_MAX})
    topic = settings.topic(TOPICS.conversions.base)
    offsets: dict[int, int] = {}
    failed: list[str] = []

    def report(i: int) -> Any:
        def done(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                failed.append(f"record {i}: {err}")
            else:
                offsets[i] = msg.offset() or 0
        return done

    for i, (value, key, headers) in enumerate(records):
        producer.produce(topic, value, key, partition=0,  # a null header value on purpose
                         headers=headers or None,  # type: ignore[arg-type]
                         on_delivery=report(i))
        producer.poll(0)
    assert producer.flush(60) == 0 and not failed, failed
    return [offsets[i] for i in range(len(records))]


def test_every_hostile_record_is_dead_lettered_or_fanned_out_and_the_partition_flows(
        settings: Settings, stack: Stack, namespace: str) -> None:
    now = int(time.time() * 1000)
    seed_endpoints(settings, apps=1, endpoints_per_app=1, receiver_url="http://127.0.0.1:9",
                   namespace=namespace, now_ms=now)
    up = Upstream(app_id_for(namespace, 1), now)
    good = up.enc("cv_x")
    u = "undecodable"
    inv = "invalid_record"
    cases = [
        # framing and schema
        Case("empty value", b"", reason=u, words=("too short",)),
        Case("tombstone", None, reason=u, words=("tombstone",)),
        Case("Confluent framing", b"\x00\x00\x00\x00\x07" + good[10:], reason=u,
             words=("not Avro single-object encoding",)),
        Case("magic only", MAGIC, reason=u, words=("too short",)),
        Case("unknown fingerprint", MAGIC + (12345).to_bytes(8, "little") + good[10:],
             reason=u, words=("unknown writer schema fingerprint",)),
        Case("truncated body", good[:-5], reason=u, words=("corrupt body",)),
        Case("trailing garbage", good + b"\x00garbage", reason=u, words=("trailing bytes",)),
        Case("another record type", codec_for("Outcome").encode({
            "outcome_id": "out_1", "kind": "delivered", "delivery_id": "dlv_1",
            "endpoint_id": "ep_1", "app_id": up.app, "conversion_id": "cv_1",
            "event_type": "conversion", "goal_id": None, "idempotency_key": "msg_1",
            "payout_usd_micros": 1, "attempt_no": 1, "occurred_at": now, "reason": None,
            "actor": None}), reason=u, words=("unknown writer schema fingerprint",)),
        Case("a Delivery", codec_for("Delivery").encode(make_delivery()), reason=u,
             words=("unknown writer schema fingerprint",)),
        Case("occurred_at as an ISO string, own schema",
             up.variant("cv_iso_own", {"occurred_at": "string"}, lie=False,
                        occurred_at="2026-03-01T12:00:00Z"),
             reason=u, words=("unknown writer schema fingerprint",)),
        Case("occurred_at as an ISO string, our fingerprint",
             up.variant("cv_iso_lie", {"occurred_at": "string"}, lie=True,
                        occurred_at="2026-03-01T14:00:00.250+02:00"),
             reason=u, words=("corrupt body",)),
        Case("payout NaN as a double, our fingerprint",
             up.variant("cv_nan", {"payout_usd_micros": ["null", "double"]}, lie=True,
                        payout_usd_micros=float("nan")), reason=u, words=("corrupt body",)),
        Case("payout Inf as a double, own schema",
             up.variant("cv_inf", {"payout_usd_micros": ["null", "double"]}, lie=False,
                        payout_usd_micros=float("inf")),
             reason=u, words=("unknown writer schema fingerprint",)),
        Case("invalid UTF-8", up.with_raw_conversion_id(b"cv_\xff\xfe"), reason=u,
             words=("UnicodeDecodeError",)),
        Case("UTF-16 surrogate as UTF-8", up.with_raw_conversion_id(b"cv_\xed\xa0\x80"),
             reason=u, words=("UnicodeDecodeError",)),
        # accepted as the contract allows
        Case("fingerprint byte-swapped", MAGIC + int.from_bytes(
            _FP.to_bytes(8, "little"), "big").to_bytes(8, "little") + up.enc("cv_swapped")[10:]),
        Case("older writer version", up.older_writer("cv_old")),
        Case("null key", up.enc("cv_null_key"), key=None),
        Case("empty key", up.enc("cv_empty_key"), key=b""),
        Case("key not the conversion id", up.enc("cv_other_key"), key=b"other"),
        Case("odd headers", up.enc("cv_headers"), key=b"cv_headers", headers=[
            ("", b""), ("x", None), ("x", b"twice"), ("bin", b"\x00\xff" * 64),
            ("big", b"h" * 50_000)]),
        Case("big but fits (~500 kB)", up.enc("cv_big_ok", source_snapshot=_big_snapshot(
            500_000))),
        Case("payout zero", up.enc("cv_pay_zero", payout_usd_micros=0)),
        Case("payout USD 1,000,000", up.enc("cv_pay_max", payout_usd_micros=10**12)),
        Case("occurred_at 30 min ahead", up.enc("cv_soon", occurred_at=now + 1_800_000)),
        Case("line and paragraph separators, BOM", up.enc("cv_seps\u2028", goal_id="\u2028\ufeff")),
        Case("duplicate, first", up.enc("cv_dup"), key=b"cv_dup"),
        Case("duplicate, again", up.enc("cv_dup"), key=b"cv_dup"),
        # fields a later stage cannot handle
        # an app id an endpoint's differs from only by what no one sees: it reached no
        # endpoint, and no one learnt of it
        Case("app_id with a zero-width space", up.enc("cv_zw_app", app_id=up.app + "\u200b"),
             reason=inv, words=("an invisible character",)),
        # ... or by a look-alike letter, or by a character no endpoint's app id can hold
        Case("app_id with a Cyrillic look-alike letter",
             up.enc("cv_cyr_app", app_id="\u0430" + up.app[1:]), reason=inv,
             words=("can never match an endpoint",)),
        Case("app_id with a slash", up.enc("cv_slash_app", app_id=up.app + "/1"), reason=inv,
             words=("can never match an endpoint",)),
        Case("currency not ISO 4217", up.enc("cv_cur", original_currency="usd "), reason=inv,
             words=("is not a three-letter ISO 4217 code",)),
        Case("payout negative", up.enc("cv_pay_neg", payout_usd_micros=-1), reason=inv,
             words=("payout_usd_micros -1 is negative",)),
        Case("source time before 1970", up.enc("cv_src_pre", source_completed_at=-DAY_MS),
             reason=inv, words=("source_completed_at -86400000 is outside 1970-01-01",)),
        Case("control characters in ids (the derived ids join the ids with them)",
             up.enc("cv_ctrl\r\n\t\x1b"), reason=inv,
             words=("conversion_id", "holds a control character")),
        Case("NUL in conversion_id", up.enc("cv_nul\x00x"), reason=inv,
             words=("conversion_id holds a NUL character",)),
        Case("NUL in a snapshot value", up.enc("cv_nul_snap", source_snapshot={"a": "x\x00"}),
             reason=inv, words=("source_snapshot 'a'", "NUL")),
        Case("NUL in a snapshot key", up.enc("cv_nul_key", source_snapshot={"a\x00": "x"}),
             reason=inv, words=("source_snapshot 'a\\x00'", "NUL")),
        Case("NUL in goal_id and producer", up.enc("cv_nul_goal", goal_id="g\x00",
                                                   producer="p\x00"),
             reason=inv, words=("goal_id holds a NUL", "producer holds a NUL")),
        Case("conversion_id of 3,000 characters", up.enc("cv_" + os.urandom(1500).hex()[:2997]),
             reason=inv, words=("conversion_id is 3,000 characters long (at most 200)",)),
        Case("unknown event_type", up.enc("cv_type", event_type="Conversion"), reason=inv,
             words=("event_type 'Conversion' is not a known event type",)),
        # valid, for an app no endpoint subscribes to: no delivery, no dead letter, counted
        Case("an app no endpoint subscribes to", up.enc("cv_unrouted", app_id=up.app + "_x")),
        Case("payout 2^63 - 1", up.enc("cv_pay_huge", payout_usd_micros=2**63 - 1),
             reason=inv, words=("payout_usd_micros 9223372036854775807 is over",)),
        Case("occurred_at 2^62", up.enc("cv_far", occurred_at=2**62), reason=inv,
             words=("ahead of the clock",)),
        Case("occurred_at past 9999-12-31", up.enc("cv_9999", occurred_at=253_402_300_800_000),
             reason=inv, words=("ahead of the clock",)),
        Case("occurred_at a day ahead", up.enc("cv_day", occurred_at=now + DAY_MS), reason=inv,
             words=("ahead of the clock",)),
        Case("occurred_at in epoch seconds", up.enc("cv_secs", occurred_at=now // 1000),
             reason=inv, words=("epoch seconds",)),
        Case("occurred_at zero", up.enc("cv_zero", occurred_at=0), reason="missing_field",
             words=("occurred_at must be a positive",)),
        Case("occurred_at -2^63", up.enc("cv_min", occurred_at=-2**63), reason="missing_field",
             words=("occurred_at must be a positive",)),
        Case("event_id empty", up.enc("cv_no_evt", event_id=""), reason="missing_field",
             words=("event_id",)),
        Case("event_type blank", up.enc("cv_blank", event_type="  "), reason="missing_field",
             words=("event_type",)),
        # size: near the broker's limit
        Case("delivery too large (~1,000,500 bytes)", up.enc(
            "cv_huge", source_snapshot=_big_snapshot(1_000_000)), key=b"cv_huge",
            reason="too_large", words=("its delivery is", "original bytes cut"), cut=True),
        Case("garbage near the broker's limit", MAGIC + os.urandom(1_039_998), reason=u,
             words=("original bytes cut", "unknown writer schema fingerprint"), cut=True),
        Case("600 kB key, garbage value", b"\xc3\x01garbage", key=b"K" * 600_000, reason=u,
             words=("original bytes cut", "too short"), cut=True),
    ]
    sized = [c for c in cases if c.value is not None and len(c.value) > 1_000_000]
    assert len(sized) == 2, [len(c.value or b"") for c in sized]

    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]] = []
    for i, c in enumerate(cases):
        records.append((c.value, c.key, c.headers))
        records.append((up.enc(f"cv_good_{i:03d}"), f"cv_good_{i:03d}".encode(), []))
    offsets = _produce(settings, records)

    fanout = stack.start("fanout", "fanout")
    bad = [c for c in cases if c.reason is not None]
    fanned = [c for c in cases if c.reason is None]
    dead = {d["origin_offset"]: d for d in (
        decode("DeadLetter", m) for m in read_topic(settings, TOPICS.dlq.base, len(bad), 120))}
    want_deliveries = len(fanned) - 1 + len(cases)  # one endpoint subscribes (not to _x)
    got = [decode("Delivery", m)
           for m in read_topic(settings, TOPICS.deliveries.base, want_deliveries, 120)]
    by_conversion: dict[str, int] = {}
    for d in got:
        cid = d["conversion"]["conversion_id"]
        by_conversion[cid] = by_conversion.get(cid, 0) + 1

    problems: list[str] = []
    for i, c in enumerate(cases):
        off = offsets[2 * i]
        dl = dead.get(off)
        if c.reason is None:
            if dl is not None:
                problems.append(f"{c.name}: dead-lettered ({dl['reason']}: "
                                f"{dl['error_message'][:200]})")
        elif dl is None:
            problems.append(f"{c.name}: no dead letter")
        else:
            if dl["reason"] != c.reason:
                problems.append(f"{c.name}: reason {dl['reason']}, expected {c.reason} "
                                f"({dl['error_message'][:200]})")
            missing = [w for w in c.words if w not in dl["error_message"]]
            if missing:
                problems.append(f"{c.name}: {missing} not in {dl['error_message'][:300]!r}")
            if c.cut:  # as much as fits of the value, the first kB of the key
                kept, value = dl["original_value"] or b"", c.value or b""
                if not value.startswith(kept) or len(kept) < min(len(value), 900_000):
                    problems.append(f"{c.name}: original value not cut to its first bytes")
                if dl["original_key"] != (c.key or b"")[:1024]:
                    problems.append(f"{c.name}: original key not its first kB")
            elif dl["original_value"] != c.value or dl["original_key"] != c.key:
                problems.append(f"{c.name}: original bytes not kept")
            if dl["stage"] != "fanout" or dl["origin_partition"] != 0:
                problems.append(f"{c.name}: stage {dl['stage']}, partition "
                                f"{dl['origin_partition']}")
        if by_conversion.get(f"cv_good_{i:03d}") != 1:
            problems.append(f"the good record after {c.name!r}: "
                            f"{by_conversion.get(f'cv_good_{i:03d}', 0)} deliveries")
    extra = set(dead) - {offsets[2 * i] for i, c in enumerate(cases) if c.reason}
    if extra:
        problems.append(f"unexpected dead letters at offsets {sorted(extra)}")
    fanned_ids = {"cv_swapped", "cv_old", "cv_null_key", "cv_empty_key", "cv_other_key",
                  "cv_headers", "cv_big_ok", "cv_pay_zero", "cv_pay_max", "cv_soon",
                  "cv_seps\u2028"}
    for cid in fanned_ids:
        if by_conversion.get(cid) != 1:
            problems.append(f"{cid!r}: {by_conversion.get(cid, 0)} deliveries")
    # a conversion sent twice: the same delivery (same id) twice, for the sink to absorb
    dups = {d["delivery_id"] for d in got if d["conversion"]["conversion_id"] == "cv_dup"}
    if by_conversion.get("cv_dup") != 2 or len(dups) != 1:
        problems.append(f"duplicate: {by_conversion.get('cv_dup')} deliveries, ids {dups}")
    assert not problems, "\n".join(problems)
    # every dead letter counted once, by its reason, in the stage's webhook_dlq_total
    want = {r: float(n) for r, n in Counter(d["reason"] for d in dead.values()).items()}
    wait_for(lambda: dead_letters_counted(fanout.log_path, "fanout") == want, 30,
             what=f"webhook_dlq_total{{stage=fanout}} == {want}",
             progress=lambda: dead_letters_counted(fanout.log_path, "fanout"))
    assert by_conversion.get("cv_unrouted") is None
    metrics = f"http://{metrics_target(fanout.log_path)}/metrics"
    assert re.search(r"^postbacks_fanout_unrouted_total 1\.0$",
                     urllib.request.urlopen(metrics, timeout=5).read().decode(), re.M)
    assert fanout.alive()
    assert "restarting in place" not in fanout.tail(2000)


def test_records_that_stopped_the_gate_or_the_sink_are_dead_lettered_and_both_keep_going(
        settings: Settings, stack: Stack, namespace: str) -> None:
    now = int(time.time() * 1000)
    at = now - now % 60_000 + 1  # every good record in one event-time minute
    seed_endpoints(settings, apps=1, endpoints_per_app=1, receiver_url="http://127.0.0.1:9",
                   namespace=namespace, now_ms=now)
    up = Upstream(app_id_for(namespace, 1), at)
    hostile = [
        up.enc("cv_nul\x00"),  # the sink: text cannot hold NUL
        up.enc("cv_snap", source_snapshot={"player": "p\x00"}),  # nor can jsonb
        up.enc("cv_" + os.urandom(1500).hex()),  # the sink: the conversion_id index
        up.enc("cv_pay_a", payout_usd_micros=2**63 - 1),  # the gate: two of these in a
        up.enc("cv_pay_b", payout_usd_micros=2**63 - 1),  # minute overflow its partial
        up.enc("cv_future", occurred_at=2**62),  # the gate: its partition's window
    ]
    goods = [up.enc(f"cv_good_{i}", payout_usd_micros=GOOD_PAYOUT) for i in range(len(hostile))]
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]] = []
    for bad, ok in zip(hostile, goods, strict=True):
        records += [(bad, b"k", []), (ok, b"k", [])]
    _produce(settings, records)

    feed = GateFeed(settings)
    for stage in ("sink", "gate", "fanout"):
        stack.start(stage, stage)
    feed.wait_outputs(len(goods), timeout=120)
    assert sorted(d["conversion"]["conversion_id"] for d in feed.dispatched.values()) == \
        sorted(f"cv_good_{i}" for i in range(len(goods)))

    topic = settings.topic(TOPICS.conversions.base)

    def stored() -> tuple[int, int]:
        return (int(scalar(settings, "SELECT count(*) FROM dead_letters WHERE origin_topic"
                           " = %s AND stage = 'fanout' AND reason = 'invalid_record'",
                           (topic,))),
                int(scalar(settings, "SELECT count(*) FROM deliveries WHERE app_id = %s",
                           (up.app,))))

    wait_for(lambda: stored() == (len(hostile), len(goods)), 90,
             what="the dead letters and the good deliveries in PostgreSQL", progress=stored)
    # the gate counted every good payout in the minute they happened in
    feed.wait_partials_applied(timeout=60)
    assert feed.partial_sum(at) == len(goods) * GOOD_PAYOUT
    for name in ("sink", "gate", "fanout"):
        proc = stack.procs[name]
        assert proc.alive(), name
        assert "restarting in place" not in proc.tail(4000), proc.tail(60)
        assert "Traceback" not in proc.tail(4000), proc.tail(60)


def test_deliveries_the_gate_cannot_count_are_held_naming_the_field_and_it_keeps_going(
        settings: Settings, stack: Stack, namespace: str) -> None:
    now = int(time.time() * 1000)
    at = now - now % 60_000 + 1  # every good record in one event-time minute
    with connect(settings.database_url) as conn:
        set_mode(conn, scope="global", scope_key=settings.anomaly_global_key,
                 detector="value_rate", mode="enforce", params=None, actor="test")
        conn.commit()
    feed = GateFeed(settings)
    ep = f"ep_{namespace}"
    hostile = {  # delivery id -> the field its held outcome names
        feed.send(ep, at, 2**63 - 1): "payout_usd_micros (unparseable)",
        feed.send(ep, at, 2**63 - 1): "payout_usd_micros (unparseable)",
        feed.send(ep, 2**62, GOOD_PAYOUT, source_created_at=at,
                  source_completed_at=at): "occurred_at (unparseable)",
        # in seconds, and so are its source times (taken from it): each field named
        feed.send(ep, at // 1000, GOOD_PAYOUT): "source_created_at (unparseable), "
        "source_completed_at (unparseable); occurred_at (unparseable)",
    }
    goods = [feed.send(ep, at, GOOD_PAYOUT) for _ in range(3)]
    feed.flush()
    gate = stack.start("gate", "gate")
    feed.wait_outputs(len(hostile) + len(goods), timeout=120)
    assert sorted(feed.dispatched) == sorted(goods)
    assert {d["delivery_id"]: d["hold_reason"] for d in feed.held()} == dict.fromkeys(
        hostile, "missing_anomaly_inputs")
    reasons = {o["delivery_id"]: o["reason"] for o in (
        decode("Outcome", m) for m in read_topic(settings, TOPICS.outcomes.base, len(hostile)))}
    assert reasons == {d: f"missing_anomaly_inputs: {f}" for d, f in hostile.items()}
    feed.wait_partials_applied(timeout=60)
    assert feed.partial_sum(at) == len(goods) * GOOD_PAYOUT
    assert gate.alive()
    assert "restarting in place" not in gate.tail(4000), gate.tail(60)
    assert "Traceback" not in gate.tail(4000), gate.tail(60)
