"""Operational notifications: what becomes an event, the hour slots, the breaker clock,
and that an owner's notification renders and signs on a v3 and a v2 endpoint."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest
from standardwebhooks import Webhook

from postbacks.codec import codec_for
from postbacks.core import notify
from postbacks.core.endpoint import Endpoint, EndpointConfig, SigningSecret
from postbacks.core.endpoint_check import endpoint_problems
from postbacks.core.render import render
from postbacks.core.signing import decode_secret, generate_secret
from postbacks.errors import ConfigError
from postbacks.records import (
    BreakerStateRecord,
    DeadLetterRecord,
    OperationalEventRecord,
    OutcomeRecord,
)

H = notify.HOUR_MS
T0 = 1_700_000_000_000 - 1_700_000_000_000 % H  # the start of a UTC hour
S = 1000


def _dl(**over: Any) -> DeadLetterRecord:
    base: dict[str, Any] = dict(
        dead_letter_id="dlq_1", reason="permanent", error_class="http_404",
        error_message="404", stage="agent", origin_topic="dispatch.v1", origin_partition=0,
        origin_offset=1, original_key=b"ep_1", original_value=b"x", delivery_id="dlv_1",
        endpoint_id="ep_1", occurred_at=T0 + 10 * S)
    return DeadLetterRecord(**{**base, **over})  # type: ignore[typeddict-item]


def _outcome(kind: str, at: int, reason: str | None = "breaker_open",
             ep: str = "ep_1", oid: str = "out_1") -> OutcomeRecord:
    return OutcomeRecord(
        outcome_id=oid, kind=kind, delivery_id="dlv_1", endpoint_id=ep, app_id="app_1",
        conversion_id="cv_1", event_type="install", goal_id=None, idempotency_key="msg_1",
        payout_usd_micros=None, attempt_no=0, occurred_at=at, reason=reason, actor=None)


def _bs(**over: Any) -> BreakerStateRecord:
    base: dict[str, Any] = dict(
        scope="endpoint", scope_key="ep_1", detector="payout_rate", state="tripped",
        changed_at=T0 + 5 * S, reason="payout 10x baseline", actor=None,
        observed_value=1000.0, baseline_value=100.0)
    return BreakerStateRecord(**{**base, **over})  # type: ignore[typeddict-item]


@pytest.mark.parametrize(("ms", "hour"), [
    (T0, T0), (T0 + 1, T0), (T0 + H - 1, T0), (T0 + H, T0 + H), (T0 - 1, T0 - H),
])
def test_hour_buckets_are_utc_hours(ms: int, hour: int) -> None:
    assert notify.hour_of(ms) == hour


@pytest.mark.parametrize(("over", "endpoint", "hour"), [
    ({}, "ep_1", T0),
    ({"endpoint_id": None}, None, None),           # undecodable: no endpoint to tell
    ({"endpoint_id": ""}, None, None),
    ({"occurred_at": T0 + H + 5}, "ep_1", T0 + H),  # the next hour is a new slot
    ({"occurred_at": 0}, "ep_1", T0 + 2 * H),       # no time: now's hour
])
def test_a_dead_letter_is_a_first_in_the_hour_candidate(
        over: dict[str, Any], endpoint: str | None, hour: int | None) -> None:
    ev = notify.from_dead_letter(_dl(**over), now_ms=T0 + 2 * H + 7)
    if endpoint is None:
        assert ev is None
        return
    assert ev is not None
    assert ev["kind"] == notify.DEAD_LETTER_FIRST
    assert notify.slot_of(ev) == notify.Slot(endpoint, notify.DEAD_LETTER_FIRST, hour)
    assert ev["detail"]["dead_letter_id"] == "dlq_1"
    assert ev["detail"]["reason"] == ev["reason"] == "permanent"
    assert ev["event_id"].startswith("ops_")


def test_event_ids_follow_the_fact_so_a_reread_fact_finds_its_own_claim() -> None:
    a = notify.from_dead_letter(_dl(), T0)
    again = notify.from_dead_letter(_dl(), T0 + 99 * S)
    other = notify.from_dead_letter(_dl(dead_letter_id="dlq_2"), T0)
    assert a and again and other
    assert a["event_id"] == again["event_id"] != other["event_id"]
    assert notify.slot_of(a) == notify.slot_of(other)  # same slot: the second is aggregated


@pytest.mark.parametrize(("over", "endpoint", "scope"), [
    ({}, "ep_1", "endpoint"),
    ({"scope": "global", "scope_key": "*"}, None, "global"),
    ({"state": "closed"}, "-", None),
])
def test_a_tripped_halt_is_an_anomaly_event(over: dict[str, Any], endpoint: str | None,
                                            scope: str | None) -> None:
    ev = notify.from_breaker_state(_bs(**over), T0)
    if scope is None:
        assert ev is None
        return
    assert ev is not None
    assert ev["kind"] == notify.ANOMALY_TRIPPED
    assert ev["endpoint_id"] == endpoint
    assert notify.slot_of(ev).endpoint_id == (endpoint or notify.GLOBAL)
    assert ev["detail"]["scope"] == scope and ev["detail"]["detector"] == "payout_rate"


OPEN = 900 * S


@pytest.mark.parametrize(("outcomes", "raised_at"), [
    # (kind, seconds after T0, reason): the index of the outcome that raises, or None
    ([("quarantined", 0, "breaker_open"), ("quarantined", 899, "breaker_open")], None),
    ([("quarantined", 0, "breaker_open"), ("quarantined", 900, "breaker_probing")], 1),
    ([("quarantined", 0, "breaker_open"), ("quarantined", 500, "breaker_open"),
      ("quarantined", 1000, "breaker_open"), ("quarantined", 1500, "breaker_open")], 2),
    # a delivery in between: the breaker closed, the clock restarts
    ([("quarantined", 0, "breaker_open"), ("delivered", 400, None),
      ("quarantined", 500, "breaker_open"), ("quarantined", 1000, "breaker_open")], None),
    # silence longer than the threshold: not continuous
    ([("quarantined", 0, "breaker_open"), ("quarantined", 1000, "breaker_open")], None),
    # quarantine for another reason (over budget) is not the breaker
    ([("quarantined", 0, "over_budget"), ("quarantined", 950, "over_budget")], None),
    ([("failing", 0, "http_503"), ("quarantined", 10, "breaker_open"),
      ("quarantined", 500, "breaker_open"), ("quarantined", 920, "breaker_open")], 3),
])
def test_breaker_open_long(outcomes: list[tuple[str, int, str | None]],
                           raised_at: int | None) -> None:
    watch = notify.BreakerWatch(OPEN)
    raised = []
    for i, (kind, sec, reason) in enumerate(outcomes):
        ev = watch.observe(_outcome(kind, T0 + sec * S, reason, oid=f"out_{i}"), T0 + sec * S)
        if ev is not None:
            raised.append((i, ev))
    if raised_at is None:
        assert raised == []
        return
    assert [i for i, _ in raised] == [raised_at]
    ev = raised[0][1]
    assert ev["kind"] == notify.BREAKER_OPEN_LONG and ev["endpoint_id"] == "ep_1"
    assert int(ev["detail"]["open_s"]) >= 900


def test_breaker_open_long_once_per_run_and_per_endpoint() -> None:
    watch = notify.BreakerWatch(OPEN)
    got = [watch.observe(_outcome("quarantined", T0 + s * S, ep=ep), T0 + s * S)
           for s in (0, 600, 1200, 1800) for ep in ("ep_1", "ep_2")]
    assert [e["endpoint_id"] for e in got if e] == ["ep_1", "ep_2"]
    watch.prune(T0 + 1800 * S + OPEN + 1)
    assert len(watch) == 0
    with pytest.raises(ValueError, match="positive"):
        notify.BreakerWatch(0)


def test_seen_slots_keep_the_current_and_previous_hour() -> None:
    seen = notify.SeenSlots()
    old = notify.Slot("ep_1", notify.DEAD_LETTER_FIRST, T0)
    new = notify.Slot("ep_1", notify.DEAD_LETTER_FIRST, T0 + 2 * H)
    seen.mark(old)
    seen.mark(new)
    assert seen.taken(old) and seen.taken(new)
    seen.prune(T0 + 2 * H + 1)
    assert not seen.taken(old) and seen.taken(new) and len(seen) == 1


def _target(provider: str = "v3", url: str = "https://ops.example.test/notify",
            ) -> tuple[Endpoint, str]:
    secret = generate_secret(b"\x03" * 32)
    ep = Endpoint("ep_ops", "app_ops", url, frozenset({"*"}), provider=provider,
                  secrets=(SigningSecret("s1", decode_secret(secret), 0),))
    return ep, secret


def _event() -> OperationalEventRecord:
    ev = notify.from_dead_letter(_dl(), T0)
    assert ev is not None
    return OperationalEventRecord(**{**ev, "app_id": "app_1"})


def test_a_notification_renders_and_signs_on_a_v3_endpoint() -> None:
    now = int(time.time() * 1000)
    target, secret = _target()
    d = notify.plan_notification(_event(), "app_1", target, idem_key=b"k", now_ms=now)
    assert d["endpoint_id"] == "ep_ops"
    again = notify.plan_notification(_event(), "app_1", target, idem_key=b"k", now_ms=now + 5)
    assert (d["delivery_id"], d["idempotency_key"]) == (again["delivery_id"],
                                                        again["idempotency_key"])
    snap = d["conversion"]["source_snapshot"]
    assert snap["kind"] == "dead_letter.first" and snap["endpoint_id"] == "ep_1"
    assert snap["dead_letter_id"] == "dlq_1" and snap["reason"] == "permanent"
    codec = codec_for("Delivery")
    assert codec.decode(codec.encode(d)) == {**d, "override": None}  # it goes on dispatch.v1
    req = render(d, target, now_ms=now)
    Webhook(secret).verify(req.body, req.headers)
    body = orjson.loads(req.body)
    assert body["type"] == "operations.dead_letter.first"
    assert body["data"]["conversion_id"] == _event()["event_id"]
    assert body["data"]["app_id"] == "app_1"


def test_a_v2_endpoint_can_carry_the_event_fields_from_the_snapshot() -> None:
    now = int(time.time() * 1000)
    target, _ = _target(
        "v2", "https://ops.example.test/n?k={snapshot.kind}&ep={snapshot.endpoint_id}"
              "&why={snapshot.reason}")
    target = Endpoint(target.endpoint_id, target.app_id, target.url, target.event_types,
                      provider="v2", method="GET", secrets=target.secrets)
    d = notify.plan_notification(_event(), "app_1", target, idem_key=b"k", now_ms=now)
    req = render(d, target, now_ms=now)
    assert "k=dead_letter.first" in req.url and "ep=ep_1" in req.url
    assert "why=permanent" in req.url


@pytest.mark.parametrize(("value", "ok"), [
    ("ep_ops", True), (None, True), ("", False), ("ep_", False), ("ops", False), (3, False),
])
def test_notify_endpoint_id_is_validated(value: object, ok: bool) -> None:
    if not ok:
        with pytest.raises(ConfigError, match="notify_endpoint_id"):
            EndpointConfig.from_json({"notify_endpoint_id": value})
        return
    cfg = EndpointConfig.from_json({"notify_endpoint_id": value})
    assert cfg.notify_endpoint_id == value
    assert EndpointConfig.from_json(cfg.to_json()) == cfg


def test_an_endpoint_cannot_notify_itself() -> None:
    target, _ = _target()
    own = Endpoint("ep_1", "app_1", "https://pub.example.test/hook", frozenset({"*"}),
                   secrets=target.secrets,
                   config=EndpointConfig.from_json({"notify_endpoint_id": "ep_1"}))
    assert any("itself" in p for p in endpoint_problems(own, now_ms=int(time.time() * 1000)))
    other = Endpoint(own.endpoint_id, own.app_id, own.url, own.event_types,
                     secrets=own.secrets,
                     config=EndpointConfig.from_json({"notify_endpoint_id": "ep_ops"}))
    assert endpoint_problems(other, now_ms=int(time.time() * 1000)) == []


class _Claims:
    """notification slots as PostgreSQL's ``claim_slot``: the same event may claim its own
    slot again (a fact read again), another event of the slot may not."""

    def __init__(self) -> None:
        self.by_slot: dict[notify.Slot, str] = {}

    def claim(self, slot: notify.Slot, event_id: str) -> bool:
        return self.by_slot.setdefault(slot, event_id) == event_id

    def endpoint(self, _endpoint_id: str) -> None:
        return None

    def close(self) -> None:
        pass


def test_a_batch_read_again_after_an_abort_is_notified_again() -> None:
    """A notifier batch whose transaction aborted is read again; its memory of slots taken
    and breaker runs raised used to keep the events from being produced the second time
    (lost); ``after_commit(False)`` undoes that batch's part of it."""
    import threading

    from postbacks.kafka.stage import Output
    from postbacks.settings import load_settings
    from streams.notifier import Notifier
    from tests.unit.factories import FakeMessage

    s = load_settings()
    n = Notifier(s, {}, None, threading.Event())  # type: ignore[arg-type]
    n.db = _Claims()  # type: ignore[assignment]
    n.watch = notify.BreakerWatch(60 * S)
    dl = FakeMessage(codec_for("DeadLetter").encode(_dl()), topic=s.topic("dlq.v1"))
    outcomes = [FakeMessage(codec_for("Outcome").encode(
        _outcome("quarantined", T0 + i * 30 * S, oid=f"out_{i}")), topic=s.topic("outcomes.v1"))
        for i in range(3)]

    def batch() -> list[str]:
        out = Output()
        for m in (dl, *outcomes):
            n.handle(m, out, T0 + 100 * S)  # type: ignore[arg-type]
        ops = codec_for("OperationalEvent")
        return sorted(ops.decode(v)["kind"] for t, _, v in out.items if t == "operations.v1")

    first = batch()
    assert first == ["breaker.open_long", "dead_letter.first"]
    n.after_commit(False)  # aborted: read again
    assert batch() == first
    n.after_commit(True)
    assert batch() == []  # committed: the same facts again are aggregated
