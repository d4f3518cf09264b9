"""Replays through the whole pipeline: an edit-and-replay override reaches the agent (fields
and aliases change the body, the URL changes the target), a bad override or a refused
address never calls anyone, and the agent re-checks an overridden URL itself."""

from __future__ import annotations

import json
import time

from postbacks.codec import codec_for
from postbacks.kafka.publish import publish_acked
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, http_json, wait_for
from tests.e2e.harness import Harness
from tests.integration.anomaly_helpers import held_delivery, insert_deliveries
from topics import TOPICS


def _redrive(settings: Settings, h: Harness, ep: str, n: int, override: str | None) -> str:
    """A manual re-drive of a fresh delivery for ``ep`` onto retry.5s, as the drainer does."""
    d = held_delivery(h.namespace, n, endpoint=ep, app=h.app(ep.rsplit("_", 1)[1]))
    insert_deliveries(settings, [d], status="exhausted")  # the stored delivery replayed
    now = int(time.time() * 1000)
    record = {**d, "trigger": "manual", "triggered_by": "support:test", "due_at": now,
              "override": override}
    publish_acked(settings, [(settings.topic(TOPICS.retry_tier("5s").base), ep.encode(),
                              codec_for("Delivery").encode(record))])
    return d["idempotency_key"]


def test_overrides_reach_the_agent_and_bad_ones_never_send(
        settings: Settings, stack: Stack, namespace: str) -> None:
    h = Harness(settings, stack, namespace)
    h.start_receiver()
    ep = h.endpoint("edit")
    moved = f"{ep}_moved"
    http_json(f"{h.base}/_control/secrets", {moved: [h.secrets[ep]]})
    for stage in ("sink", "relay", "agent"):
        stack.start(stage, stage)

    key = _redrive(settings, h, ep, 1, json.dumps({
        "url": f"{h.base}/hooks/{moved}", "fields": ["conversion_id", "payout_usd"],
        "aliases": {"payout_usd": "amount"}}))
    bad_json = _redrive(settings, h, ep, 2, "{not json")
    unknown = _redrive(settings, h, ep, 3, json.dumps({"method": "DELETE"}))
    blocked = _redrive(settings, h, ep, 4, json.dumps({"url": "http://10.255.255.1/x"}))
    plain = _redrive(settings, h, ep, 5, None)

    wait_for(lambda: h.scalar("SELECT count(*) FROM delivery_attempts WHERE endpoint_id = %s"
                              " AND trigger = 'manual'", (ep,)) == 5, 90, what="5 attempts")
    h.wait_status(ep, "delivered", 2)
    h.wait_status(ep, "suppressed", 2)
    h.wait_status(ep, "dead_lettered", 1)
    [got] = h.received(moved)
    assert got["idempotency_key"] == key and got["signature"] == "ok"
    body = json.loads(got["body"])
    assert set(body["data"]) == {"conversion_id", "amount"}
    assert [r["idempotency_key"] for r in h.received(ep)] == [plain]
    reasons = dict(h.scalar("SELECT array_agg(ARRAY[d.idempotency_key, s.reason])"
                            " FROM postback_suppressions s JOIN deliveries d USING"
                            " (delivery_id) WHERE s.endpoint_id = %s", (ep,)))
    assert "not JSON" in reasons[bad_json] and "unknown override key" in reasons[unknown]
    assert h.scalar("SELECT error_class FROM delivery_attempts a JOIN deliveries d USING"
                    " (delivery_id) WHERE d.idempotency_key = %s", (blocked,)) \
        == "blocked_address"
    assert h.scalar("SELECT count(*) FROM delivery_attempts WHERE endpoint_id = %s"
                    " AND trigger = 'manual'", (ep,)) == 5
