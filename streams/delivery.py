"""One delivery attempt, from dispatch record to the records it yields.

render -> sign -> intent -> send -> classify -> (attempt, next step, outcome). The intent
(postbacks/core/intents.py) is stored before the request goes out, outside the agent's
transaction, so a request sent by an agent that dies before committing its attempt is still
in the attempt log. Everything else one attempt produces is returned as a list of
(topic, key, value) so the agent can commit it together with the input's offset. The HTTP
call goes through the transport adapter; the decisions are the pure core's.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from postbacks.codec import codec_for
from postbacks.core.classify import Delivered, Permanent, Retryable, Verdict, classify
from postbacks.core.endpoint import Endpoint
from postbacks.core.intents import INTENT
from postbacks.core.outcomes import make_attempt, make_outcome
from postbacks.core.override import OverrideError, apply_override, parse_override
from postbacks.core.quarantine import divert_topic, quarantine_note, times_quarantined
from postbacks.core.redact import NO_REDACTION, Redaction, redact_request
from postbacks.core.render import RenderedRequest, RenderError, render
from postbacks.core.retry import DeadLetter, RetryPolicy, ScheduleRetry, next_step
from postbacks.core.validators import check_response, effective_validator
from postbacks.errors import DeadLetterError
from postbacks.ids import new_id
from postbacks.kafka.stage import dead_letter_for
from postbacks.metrics import (
    ATTEMPTS_TOTAL,
    LATENCY,
    OUTCOMES_TOTAL,
    PAYOUT_USD,
    RENDER_ERRORS,
    VALIDATION_FAILED,
    child,
)
from postbacks.records import DeliveryRecord
from postbacks.transport.http import EXCERPT_BYTES, HttpTransport
from streams.intents import DirectLog
from streams.lane import REDRIVES
from streams.offsets import Item
from topics import TOPICS

__all__ = ["Attempted", "Deliverer", "ValidationFailed"]

_SKEW_MAX_MS = 3_600_000  # a clock further ahead than this is not taken for skew
PARKED = "endpoint_disabled"  # the hold reason of a disabled endpoint's deliveries

# The outcomes that end a delivery in the agent: its payout is counted once, at one of them.
_ENDS = frozenset({"delivered", "exhausted", "dead_lettered"})


@dataclass(frozen=True, slots=True)
class ValidationFailed:
    reason: str


@dataclass(frozen=True, slots=True)
class Attempted:
    """What one attempt meant for the endpoint's health (for the breaker), and how long
    of it the agent waited on itself (the intent's acknowledgement, a free slot among the
    HTTP client's requests in flight): not the endpoint's time, so not in the pace its
    lane measures."""

    unhealthy: bool
    waited_s: float = 0.0
    # the endpoint's Retry-After (429, 503; clamped) as a time, on the clock its retry is
    # dated by: nothing more is sent to it before then (0: none)
    back_at_ms: int = 0


@dataclass
class Deliverer:
    transport: HttpTransport
    retry: RetryPolicy
    failing_after: int = 3
    clock: Callable[[], float] = time.time
    rng: random.Random = field(default_factory=random.Random)
    # Where each attempt's intent goes, acknowledged before the request is sent (None: no
    # intents); and this agent process's name, on intents and attempts.
    intents: DirectLog | None = None
    instance: str | None = None

    def __post_init__(self) -> None:
        self._dlv = codec_for("Delivery")
        self._att = codec_for("Attempt")
        self._out = codec_for("Outcome")
        self._dlq = codec_for("DeadLetter")

    # -- records -------------------------------------------------------------------------
    def attempt(self, out: list[Item], d: DeliveryRecord, now_ms: int, result: str,
                req: RenderedRequest | None, redact: Redaction = NO_REDACTION,
                **kw: object) -> None:
        child(ATTEMPTS_TOTAL, result).inc()
        shown = None if req is None else redact_request(req, redact)
        excerpt = kw.get("excerpt")
        if isinstance(excerpt, bytes):  # a receiver echoing the endpoint's API key
            kw["excerpt"] = redact.scrub(excerpt)
        rec = make_attempt(d, now_ms=now_ms, result=result, req=shown, **kw)  # type: ignore[arg-type]
        out.append((TOPICS.attempts.base, d["endpoint_id"].encode(), self._att.encode(rec)))

    def outcome(self, out: list[Item], d: DeliveryRecord, kind: str, now_ms: int,
                reason: str | None = None) -> None:
        child(OUTCOMES_TOTAL, kind).inc()
        if kind in _ENDS:
            micros = d["conversion"]["payout_usd_micros"]
            if micros and micros > 0:  # a negative one (another producer's) counts nothing
                child(PAYOUT_USD, kind).inc(micros / 1_000_000)
        due = d["due_at"]
        if d["trigger"] in REDRIVES and due is not None and due < now_ms + _SKEW_MAX_MS:
            # dated after the console's own outcome for the re-drive (replayed, released),
            # dated ``due_at`` by the console's clock: one running ahead of ours left the
            # delivery's status at released or replayed after it was delivered
            now_ms = max(now_ms, due + 1)
        rec = make_outcome(d, kind, now_ms=now_ms, reason=reason)
        out.append((TOPICS.outcomes.base, d["endpoint_id"].encode(), self._out.encode(rec)))

    def park(self, out: list[Item], d: DeliveryRecord, now_ms: int) -> None:
        """Hold a delivery of a disabled endpoint (never sent, never dropped): it waits on
        held.v1 with reason ``endpoint_disabled`` until the endpoint is re-enabled and the
        backlog released (``postbacks endpoints enable``)."""
        self.hold(out, d, PARKED, now_ms)

    def hold(self, out: list[Item], d: DeliveryRecord, reason: str, now_ms: int) -> None:
        """Hold ``d`` on held.v1 with ``reason`` instead of sending it (a held outcome)."""
        held = DeliveryRecord(**{**d, "hold_reason": reason, "enqueued_at": now_ms})
        out.append((TOPICS.held.base, d["endpoint_id"].encode(), self._dlv.encode(held)))
        self.outcome(out, d, "held", now_ms, reason)

    def dead_letter(self, out: list[Item], raw: object, exc: BaseException, reason: str,
                    now_ms: int, d: DeliveryRecord | None = None) -> None:
        rec = dead_letter_for(raw, "agent", exc, reason, now_ms,  # type: ignore[arg-type]
                              delivery_id=d["delivery_id"] if d else None,
                              endpoint_id=d["endpoint_id"] if d else None)
        key = d["endpoint_id"].encode() if d else None
        out.append((TOPICS.dlq.base, key, self._dlq.encode(rec)))

    def forward(self, out: list[Item], topic: str, d: DeliveryRecord) -> None:
        out.append((topic, d["endpoint_id"].encode(), self._dlv.encode(d)))

    # -- decisions -----------------------------------------------------------------------
    def past_ceiling(self, d: DeliveryRecord, due_at_ms: int) -> bool:
        """Would ``d``, back at ``due_at_ms``, be past the retry ceiling (counted from its
        first attempt, as for a retry)? A delivery diverted again and again (an open
        breaker sends one probe per open period) otherwise outlived it by days."""
        first = d["first_attempt_at"]
        return first is not None and due_at_ms - first > self.retry.ceiling_s * 1000

    def exhaust(self, out: list[Item], raw: object, d: DeliveryRecord, why: str,
                now_ms: int) -> None:
        """End ``d`` as a retry does at its ceiling: dead-lettered, exhausted."""
        self.dead_letter(out, raw, DeadLetterError(f"retry ceiling passed while diverted "
                                                   f"({why})"), "exhausted", now_ms, d)
        self.outcome(out, d, "exhausted", now_ms, why)

    def quarantine(self, out: list[Item], d: DeliveryRecord, reason: str, due_at_ms: int,
                   now_ms: int) -> None:
        """Divert without consuming an attempt; it comes back through the relay at due_at."""
        times = times_quarantined(d["last_error"])
        q = DeliveryRecord(**{**d, "due_at": due_at_ms, "enqueued_at": now_ms,
                              "last_error": quarantine_note(reason, times + 1)})
        self.forward(out, divert_topic(due_at_ms, now_ms), q)
        if not times:
            self.outcome(out, d, "quarantined", now_ms, reason)

    async def deliver(self, raw: object, d: DeliveryRecord, ep: Endpoint,
                      out: list[Item]) -> Attempted:
        picked = self.clock()
        now_ms = int(picked * 1000)
        queue_ms = max(0.0, float(now_ms - (d["enqueued_at"] or d["created_at"])))
        try:
            ep = apply_override(ep, parse_override(d.get("override")), by=d["triggered_by"])
            req = render(d, ep, now_ms=now_ms)
        except (RenderError, OverrideError) as exc:
            RENDER_ERRORS.inc()
            self.attempt(out, d, now_ms, "render_failed", None, error_class="render_error",
                         error_message=str(exc), queue_ms=queue_ms,
                         agent_instance=self.instance)
            self.dead_letter(out, raw, exc, "render_failed", now_ms, d)
            self.outcome(out, d, "suppressed", now_ms, f"render_failed: {exc}")
            return Attempted(unhealthy=False)
        redact = Redaction.of(ep.config.redact_fields, ep.config.headers)
        ids: dict[str, object] = dict(attempt_id=new_id("att", now_ms),
                                      agent_instance=self.instance)
        waited = 0.0
        if self.intents is not None:
            waited = time.monotonic()
            await self._intend(d, req, redact, queue_ms, ids)
            waited = time.monotonic() - waited
        sent_at = self.clock()
        result = await self.transport.send(req, follow_redirects=ep.config.follow_redirects)
        waited += result.queued_s  # (the client's limit: other endpoints' requests in flight)
        done = self.clock()
        now_ms = int(done * 1000)
        platform_ms = max(0.0, (done - picked) * 1000 - result.wire_ms)
        if redact.fields and (result.body or result.excerpt):  # (most answers are empty)
            redact = redact.echoing(req)  # the masked fields' values, where echoed
        verdict: Verdict | ValidationFailed = classify(result.http)
        if result.blocked is not None:
            verdict = Permanent(result.http.error_class or "blocked_address")
        elif isinstance(verdict, Delivered):
            problem = check_response(effective_validator(ep), verdict.status, result.body or b"")
            if problem is not None:  # (it may quote the body: an echoed secret is masked)
                verdict = ValidationFailed(redact.scrub_text(problem))
        child(LATENCY, "queue").observe(queue_ms / 1000)
        child(LATENCY, "wire").observe(result.wire_ms / 1000)
        child(LATENCY, "platform").observe(platform_ms / 1000)
        common: dict[str, object] = dict(
            status=result.http.status, queue_ms=queue_ms, platform_ms=platform_ms,
            wire_ms=result.wire_ms, attempted_at=int(sent_at * 1000),
            excerpt=(result.excerpt if result.body is None
                     else redact.excerpt(result.body, EXCERPT_BYTES)),
            **ids,
        )
        sent_ms = int(sent_at * 1000)  # (a first attempt "in the future": another producer's)
        first = min(d["first_attempt_at"] or sent_ms, sent_ms)
        match verdict:
            case Delivered():
                self.attempt(out, d, now_ms, "delivered", req, redact, **common)
                self.outcome(out, d, "delivered", now_ms)
                return Attempted(unhealthy=False, waited_s=waited)
            case Permanent(error_class=ec):
                name = ec if ec in ("blocked_address", "invalid_url") else "permanent"
                self.attempt(out, d, now_ms, name, req, redact, error_class=ec,
                             error_message=result.blocked, **common)
                self.dead_letter(out, raw, DeadLetterError(f"permanent failure: {ec}"),
                                 name, now_ms, d)
                self.outcome(out, d, "dead_lettered", now_ms, ec)
                return Attempted(unhealthy=False, waited_s=waited)
            case ValidationFailed(reason=why):
                VALIDATION_FAILED.inc()
                self.attempt(out, d, now_ms, "validation_failed", req, redact,
                             error_class="validation_failed", error_message=why, **common)
                if ep.config.on_validation_failure == "retry":
                    self._retry_or_exhaust(out, raw, d, ep, "validation_failed", None, first,
                                           now_ms)
                else:
                    held = DeliveryRecord(**{**d, "attempt": d["attempt"] + 1,
                                             "hold_reason": "validation_failed",
                                             "enqueued_at": now_ms, "first_attempt_at": first,
                                             "last_error": why})
                    self.forward(out, TOPICS.held.base, held)
                    self.outcome(out, d, "held", now_ms, f"validation_failed: {why}")
                return Attempted(unhealthy=False, waited_s=waited)
            case Retryable(error_class=ec, retry_after_s=after):
                self.attempt(out, d, now_ms, "retryable", req, redact, error_class=ec,
                             **common)
                self._retry_or_exhaust(out, raw, d, ep, ec, after, first, now_ms)
                return Attempted(unhealthy=True, waited_s=waited,
                                 back_at_ms=now_ms + int(after * 1000) if after else 0)
        raise AssertionError(f"unhandled verdict {verdict!r}")

    async def _intend(self, d: DeliveryRecord, req: RenderedRequest, redact: Redaction,
                      queue_ms: float, ids: dict[str, object]) -> None:
        """The attempt's intent, stored before the request goes out (core/intents.py)."""
        assert self.intents is not None
        now_ms = int(self.clock() * 1000)
        rec = make_attempt(d, now_ms=now_ms, result=INTENT, req=redact_request(req, redact),
                           queue_ms=queue_ms, **ids)  # type: ignore[arg-type]
        await self.intents.send(TOPICS.attempts.base, d["endpoint_id"].encode(),
                                self._att.encode(rec))

    def _retry_or_exhaust(self, out: list[Item], raw: object, d: DeliveryRecord, ep: Endpoint,
                          ec: str, after: float | None, first: int, now_ms: int) -> None:
        attempt_no = max(d["attempt"], 0) + 1  # (below 0: another producer's; no backoff)
        policy = self.retry
        if ep.config.max_attempts is not None:  # the endpoint's cap bounds every limit
            cap = ep.config.max_attempts
            policy = RetryPolicy(policy.base_s, policy.max_delay_s, policy.ceiling_s,
                                 policy.jitter, cap,
                                 {k: min(v, cap)
                                  for k, v in policy.max_attempts_by_event_type.items()})
        step = next_step(policy, attempt_no=attempt_no, event_type=d["conversion"]["event_type"],
                         first_attempt_ms=first, now_ms=now_ms, retry_after_s=after,
                         rand=self.rng.random())
        match step:
            case ScheduleRetry(tier=tier, due_at_ms=due):
                nxt = DeliveryRecord(**{**d, "attempt": attempt_no, "trigger": "retry",
                                        "due_at": due, "enqueued_at": now_ms,
                                        "first_attempt_at": first, "last_error": ec})
                self.forward(out, TOPICS.retry_tier(tier).base, nxt)
                if attempt_no == self.failing_after:
                    self.outcome(out, d, "failing", now_ms, ec)
            case DeadLetter(reason=reason):
                self.dead_letter(out, raw, DeadLetterError(f"retries exhausted, last {ec}"),
                                 reason, now_ms, d)
                self.outcome(out, d, "exhausted", now_ms, ec)
