"""Delivery agent: dispatch.v1 -> HTTP -> attempts.v1, outcomes.v1, retry.*, dlq.v1.

Per batch: decode, render and sign each delivery, send them concurrently (at most the
endpoint's concurrency in flight per endpoint), then produce every attempt, next step and
outcome of the batch and commit the batch's input offsets in **one Kafka transaction**.
HTTP is at-least-once: a crash after a send but before the commit re-sends the delivery
with the same idempotency key; everything between topics is exactly-once.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException, Message

from postbacks.codec import codec_for
from postbacks.core.classify import Delivered, Permanent, Retryable, classify
from postbacks.core.endpoint import Endpoint
from postbacks.core.outcomes import make_attempt, make_outcome
from postbacks.core.render import RenderedRequest, RenderError, render
from postbacks.core.retry import DeadLetter, RetryPolicy, ScheduleRetry, next_step
from postbacks.db.crypto import SecretBox
from postbacks.db.endpoint_cache import EndpointCache
from postbacks.errors import DeadLetterError, PostbacksError
from postbacks.kafka.clients import check_broker, make_consumer, make_transactional_producer
from postbacks.kafka.stage import Output, commit_batch, dead_letter_for
from postbacks.metrics import (
    ATTEMPTS_TOTAL,
    DLQ_TOTAL,
    LATENCY,
    OUTCOMES_TOTAL,
    RENDER_ERRORS,
    observe_backlog,
)
from postbacks.records import DeliveryRecord
from postbacks.settings import Settings
from postbacks.topics import TOPICS
from postbacks.transport.http import HttpTransport

__all__ = ["Agent", "run_agent"]

log = logging.getLogger(__name__)


@dataclass
class Agent:
    settings: Settings
    endpoints: EndpointCache
    transport: HttpTransport
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    clock: Callable[[], float] = time.time
    rng: random.Random = field(default_factory=random.Random)
    _sems: dict[str, asyncio.Semaphore] = field(default_factory=dict)
    _last_reload: float = 0.0

    def __post_init__(self) -> None:
        self._dlv = codec_for("Delivery")
        self._att = codec_for("Attempt")
        self._out = codec_for("Outcome")
        self._dlq = codec_for("DeadLetter")

    def _sem(self, endpoint_id: str, cap: int) -> asyncio.Semaphore:
        sem = self._sems.get(endpoint_id)
        if sem is None:
            sem = self._sems[endpoint_id] = asyncio.Semaphore(cap)
        return sem

    def _endpoint(self, endpoint_id: str) -> Endpoint | None:
        ep = self.endpoints.get(endpoint_id)
        if ep is None and self.clock() - self._last_reload > 1.0:
            self._last_reload = self.clock()
            try:
                self.endpoints.load()
            except PostbacksError as exc:
                log.warning("endpoint reload failed: %s", exc)
            ep = self.endpoints.get(endpoint_id)
        return ep

    async def process(self, msg: Message, out: Output) -> None:
        """Deliver one dispatch record; everything it yields goes to ``out``."""
        picked = self.clock()
        now_ms = int(picked * 1000)
        observe_backlog(msg, now_ms)
        try:
            d: DeliveryRecord = self._dlv.decode(msg.value())  # type: ignore[assignment]
        except DeadLetterError as exc:
            self._dead_letter(msg, out, exc, exc.reason, now_ms)
            return
        key = d["endpoint_id"].encode()
        ep = self._endpoint(d["endpoint_id"])
        if ep is None:
            unknown = DeadLetterError(f"endpoint {d['endpoint_id']} is unknown or disabled")
            self._dead_letter(msg, out, unknown, "unknown_endpoint", now_ms, d)
            self._outcome(out, d, "dead_lettered", now_ms, "unknown_endpoint")
            return
        queue_ms = max(0.0, now_ms - (d["enqueued_at"] or d["created_at"]))
        try:
            req = render(d, ep, now_ms=now_ms)
        except RenderError as exc:
            RENDER_ERRORS.inc()
            self._attempt(out, d, now_ms, "render_failed", None, error_class="render_error",
                          error_message=str(exc), queue_ms=queue_ms)
            self._dead_letter(msg, out, exc, "render_failed", now_ms, d)
            self._outcome(out, d, "dead_lettered", now_ms, "render_failed")
            return
        async with self._sem(ep.endpoint_id, ep.concurrency):
            sent_at = self.clock()
            result = await self.transport.send(req)
        done = self.clock()
        now_ms = int(done * 1000)
        platform_ms = max(0.0, (done - picked) * 1000 - result.wire_ms - (sent_at - picked) * 1000)
        verdict = classify(result.http)
        if result.blocked is not None:
            verdict = Permanent("blocked_address")
        common = dict(
            status=result.http.status, queue_ms=queue_ms, platform_ms=platform_ms,
            wire_ms=result.wire_ms, excerpt=result.excerpt, attempted_at=int(sent_at * 1000),
        )
        LATENCY.labels(phase="queue").observe(queue_ms / 1000)
        LATENCY.labels(phase="wire").observe(result.wire_ms / 1000)
        LATENCY.labels(phase="platform").observe(platform_ms / 1000)
        first = d["first_attempt_at"] or int(sent_at * 1000)
        match verdict:
            case Delivered():
                self._attempt(out, d, now_ms, "delivered", req, **common)
                self._outcome(out, d, "delivered", now_ms)
            case Permanent(error_class=ec):
                result_name = "blocked_address" if ec == "blocked_address" else "permanent"
                self._attempt(out, d, now_ms, result_name, req, error_class=ec,
                              error_message=result.blocked, **common)
                exc2 = DeadLetterError(f"permanent failure: {ec}")
                self._dead_letter(msg, out, exc2, result_name, now_ms, d)
                self._outcome(out, d, "dead_lettered", now_ms, ec)
            case Retryable(error_class=ec, retry_after_s=after):
                self._attempt(out, d, now_ms, "retryable", req, error_class=ec, **common)
                step = next_step(
                    self.policy, attempt_no=d["attempt"] + 1,
                    event_type=d["conversion"]["event_type"], first_attempt_ms=first,
                    now_ms=now_ms, retry_after_s=after, rand=self.rng.random(),
                )
                match step:
                    case ScheduleRetry(tier=tier, due_at_ms=due):
                        nxt = dict(d)
                        nxt.update(attempt=d["attempt"] + 1, trigger="retry", due_at=due,
                                   enqueued_at=now_ms, first_attempt_at=first, last_error=ec)
                        out.add(TOPICS.retry_tier(tier).base, key, self._dlv.encode(nxt))
                    case DeadLetter(reason=reason):
                        exc3 = DeadLetterError(f"retries exhausted, last error {ec}")
                        self._dead_letter(msg, out, exc3, reason, now_ms, d)
                        self._outcome(out, d, "exhausted", now_ms, ec)

    def _attempt(self, out: Output, d: DeliveryRecord, now_ms: int, result: str,
                 req: RenderedRequest | None, **kw: object) -> None:
        ATTEMPTS_TOTAL.labels(result=result).inc()
        rec = make_attempt(d, now_ms=now_ms, result=result, req=req, **kw)  # type: ignore[arg-type]
        out.add(TOPICS.attempts.base, d["endpoint_id"].encode(), self._att.encode(rec))

    def _outcome(self, out: Output, d: DeliveryRecord, kind: str, now_ms: int,
                 reason: str | None = None) -> None:
        OUTCOMES_TOTAL.labels(kind=kind).inc()
        rec = make_outcome(d, kind, now_ms=now_ms, reason=reason)
        out.add(TOPICS.outcomes.base, d["endpoint_id"].encode(), self._out.encode(rec))

    def _dead_letter(self, msg: Message, out: Output, exc: BaseException, reason: str,
                     now_ms: int, d: DeliveryRecord | None = None) -> None:
        DLQ_TOTAL.labels(stage="agent", reason=reason).inc()
        rec = dead_letter_for(
            msg, "agent", exc, reason, now_ms,
            delivery_id=d["delivery_id"] if d else None,
            endpoint_id=d["endpoint_id"] if d else None,
        )
        out.add(TOPICS.dlq.base, msg.key(), self._dlq.encode(rec))


async def _run(settings: Settings, stop: threading.Event) -> None:
    cache = EndpointCache(
        settings.database_url, SecretBox(settings.secrets_key.reveal()), settings.config_refresh_s
    )
    cache.start()
    consumer = make_consumer(settings, "postbacks-agent")
    producer = make_transactional_producer(settings, "agent")
    consumer.subscribe([settings.topic(TOPICS.dispatch.base)])
    loop = asyncio.get_running_loop()
    try:
        async with HttpTransport(
            timeout_s=settings.http_timeout_s, allow_loopback=settings.allow_loopback_targets
        ) as transport:
            agent = Agent(settings, cache, transport)
            while not stop.is_set():
                msgs = await loop.run_in_executor(None, consumer.consume, settings.batch_size, 0.5)
                batch = []
                offsets: dict[tuple[str, int], int] = {}
                for m in msgs:
                    err = m.error()
                    if err is not None:
                        if err.fatal():
                            raise KafkaException(err)
                        if err.code() != KafkaError._PARTITION_EOF:
                            log.warning("consumer error: %s", err)
                        continue
                    batch.append(m)
                    offsets[(m.topic() or "", m.partition() or 0)] = (m.offset() or 0) + 1
                if not batch:
                    continue
                outs = [Output() for _ in batch]
                await asyncio.gather(
                    *(agent.process(m, o) for m, o in zip(batch, outs, strict=True))
                )
                merged = Output([item for o in outs for item in o.items])
                await loop.run_in_executor(
                    None, commit_batch, "agent", settings, consumer, producer, merged, offsets
                )
    finally:
        cache.stop()
        consumer.close()


def run_agent(settings: Settings, stop: threading.Event) -> None:
    check_broker(settings)
    import uvloop

    uvloop.run(_run(settings, stop))
