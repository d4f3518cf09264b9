"""Per-endpoint lanes: one slow or broken endpoint never delays another's deliveries.

Every endpoint has its own lane: a queue of buffered work, an in-flight count capped by the
endpoint's concurrency (and by the breaker's ramp), and a circuit breaker. Work from one
Kafka partition is spread over many lanes and finishes in any order; the offset tracker
keeps commits in order. An endpoint over its buffer budget, or whose breaker is open, has
its deliveries diverted with a ``due_at`` — no attempt consumed — to ``quarantine.v1``,
or to a retry tier when due over a minute ahead (core/quarantine.py).
Breaker transitions go to ``publish`` and other agents' come in through :meth:`Lanes.adopt`
(core/breaker.py: one breaker per endpoint across every agent and restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Message

from postbacks.codec import codec_for
from postbacks.core.breaker import (
    BreakerPolicy,
    BreakerState,
    Divert,
    admit,
    merge,
    not_ahead,
    on_result,
    unused,
)
from postbacks.core.endpoint import Endpoint
from postbacks.core.notify import EVENT_TYPE_PREFIX as NOTIFICATION_TYPES
from postbacks.core.quarantine import divert_topic, paced_due, slot_ms
from postbacks.errors import DeadLetterError
from postbacks.metrics import BREAKER_OPEN, IN_FLIGHT, QUARANTINED
from postbacks.records import DeliveryRecord
from streams.delivery import Deliverer
from streams.lane import REDRIVES, Lane, Work
from streams.offsets import Item, Slot
from streams.strict import StrictOrder
from streams.unseen import Unseen

__all__ = ["Lane", "Lanes"]

log = logging.getLogger(__name__)

_PACED = frozenset({"over_budget", "breaker_open", "retry_after"})  # at the endpoint's pace


@dataclass
class Lanes:
    deliverer: Deliverer
    endpoint: Callable[[str], Endpoint | None]
    policy: BreakerPolicy
    budget_s: float
    max_queue: int
    quarantine_delay_s: float
    clock: Callable[[], float] = time.time
    lanes: dict[str, Lane] = field(default_factory=dict)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    # where this agent's breaker transitions go (endpoint id, new state); None: nowhere
    publish: Callable[[str, BreakerState], None] | None = None
    strict: StrictOrder | None = None  # strict-ordering endpoints (None: built here)
    # When the endpoint view was last known current (ms, this process's clock). A delivery
    # whose endpoint the view lacks waits UNSEEN_S in quarantine (no attempt used) until
    # the view has been refreshed since it first missed it; only then is it dead-lettered
    # as unknown. None: a missing endpoint is gone at once.
    view_checked_ms: Callable[[], int] | None = None
    # The hold reason of an anomaly halt over an endpoint now, or None (streams/halts.py);
    # None: no halts followed.
    halted: Callable[[str], str | None] | None = None

    def __post_init__(self) -> None:
        self._codec = codec_for("Delivery")
        if self.strict is None:
            self.strict = StrictOrder(self.deliverer, self._now_ms)
        self._unseen = Unseen(lambda out, d, reason, due, now: self._divert(
            out, d, reason, due, now))
        tasks = self.tasks
        IN_FLIGHT.set_function(lambda: len(tasks))  # a task per delivery in flight

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def submit(self, msg: Message, slot: Slot) -> None:
        """Take one consumed dispatch record; it finishes its slot sooner or later."""
        now_ms = self._now_ms()
        out: list[Item] = []
        try:
            d: DeliveryRecord = self._codec.decode(msg.value())  # type: ignore[assignment]
        except DeadLetterError as exc:
            self.deliverer.dead_letter(out, msg, exc, exc.reason, now_ms)
            slot.finish(out)
            return
        try:
            lane = self._admit(msg, slot, d, out, now_ms)
        except Exception as exc:  # a bug must not stall the partition: dead-letter it
            if slot.outputs is None:  # (queueing is _admit's last step: not queued yet)
                slot.finish(self._failed(msg, d, exc))
            else:
                log.exception("agent: unexpected error after %s was finished",
                              d["delivery_id"])
            return
        if lane is not None:
            self.pump(lane)

    def _admit(self, msg: Message, slot: Slot, d: DeliveryRecord, out: list[Item],
               now_ms: int) -> Lane | None:
        """Queue ``d`` in its endpoint's lane (the lane, to pump), or finish its slot."""
        if self._unseen.behind(out, d, now_ms):
            slot.finish(out)
            return None
        ep = self.endpoint(d["endpoint_id"])
        if not self._strict(ep):  # (strict: held in its turn, which resolves its order)
            why = self._halt(d)
            if why is not None:  # a tripped scope: held for review, not sent
                self.deliverer.hold(out, d, why, now_ms)
                slot.finish(out)
                return None
        if ep is not None and ep.disabled_at_ms is not None:
            self.deliverer.park(out, d, now_ms)  # disabled: held until re-enabled
            slot.finish(out)
            with contextlib.suppress(KeyError):  # nothing is sent, nothing probes: an open
                BREAKER_OPEN.remove(d["endpoint_id"])  # breaker would be shown for ever
            return None
        lane = self._lane(d["endpoint_id"])
        if self._strict(ep):
            assert self.strict is not None
            self.strict.submit(lane, Work(msg, d, slot))
            return lane
        if self._over_budget(lane, d["endpoint_id"]):
            self._divert(out, d, "over_budget", now_ms + int(self.quarantine_delay_s * 1000),
                         now_ms, msg)
            slot.finish(out)
            return None
        lane.push(Work(msg, d, slot))
        return lane

    def _failed(self, msg: Message, d: DeliveryRecord | None, exc: Exception) -> list[Item]:
        """The outputs of a record this code failed on: dead-lettered as ``internal_error``,
        with an outcome when it was read (a bug must not stall the partition)."""
        log.exception("agent: unexpected error on %s", d["delivery_id"] if d else msg.offset())
        out: list[Item] = []
        now_ms = self._now_ms()
        self.deliverer.dead_letter(out, msg, exc, "internal_error", now_ms, d)
        try:  # analytics sees the delivery end too (it had no outcome at all)
            if d is not None:
                self.deliverer.outcome(out, d, "dead_lettered", now_ms, "internal_error")
        except Exception:  # a record too odd even for that: its dead letter stands
            log.exception("agent: no outcome for %s", d["delivery_id"] if d else "")
        return out

    def _halt(self, d: DeliveryRecord) -> str | None:
        """Why ``d`` is held by an anomaly halt, or None: a person's re-drive goes out, and
        so does an owner's notification (no payout; fan-out refuses its event types)."""
        if self.halted is None:
            return None
        why = self.halted(d["endpoint_id"])  # None at once while nothing is halted
        if why is None or d["trigger"] in REDRIVES or d["conversion"]["event_type"].startswith(
                NOTIFICATION_TYPES):
            return None
        return why

    @staticmethod
    def _strict(ep: Endpoint | None) -> bool:
        return ep is not None and ep.config.ordering == "strict"

    def _lane(self, endpoint_id: str) -> Lane:
        lane = self.lanes.get(endpoint_id)
        if lane is None:
            lane = self.lanes[endpoint_id] = Lane(endpoint_id)
        return lane

    def adopt(self, endpoint_id: str, remote: BreakerState) -> None:
        """Another agent's (or an earlier run's) breaker transition for this endpoint."""
        lane = self._lane(endpoint_id)
        before = lane.breaker
        lane.breaker = merge(self.policy, before, not_ahead(remote, self._now_ms()))
        if lane.breaker is not before:
            self._changed(lane, before, own=False)
            if lane.queue or lane.redrives:
                self.pump(lane)

    def _changed(self, lane: Lane, before: BreakerState, own: bool) -> None:
        """After a breaker update: log and gauge a new state, publish our own transition."""
        after = lane.breaker
        if own and self.publish is not None and after.changed_ms != before.changed_ms:
            self.publish(lane.endpoint_id, after)
        if after.state == before.state:
            return
        log.info("breaker %s: %s -> %s%s", lane.endpoint_id, before.state, after.state,
                 "" if own else " (another agent)")
        if after.state == "open" and self._enabled(lane.endpoint_id):
            BREAKER_OPEN.labels(endpoint=lane.endpoint_id).set(1)
        elif after.state in ("ramping", "closed") and before.state in ("open", "half_open"):
            with contextlib.suppress(KeyError):  # never open here (adopted half-open)
                BREAKER_OPEN.remove(lane.endpoint_id)

    def _enabled(self, endpoint_id: str) -> bool:
        """In the view and enabled: a breaker is only shown open for an endpoint that can
        get traffic (one disabled or deleted is never probed, so never closes)."""
        ep = self.endpoint(endpoint_id)
        return ep is not None and ep.disabled_at_ms is None

    def _over_budget(self, lane: Lane, endpoint_id: str) -> bool:
        """Budget of buffered work, in time: divert when the backlog would take longer than
        ``budget_s`` to drain at the endpoint's own pace (a fast endpoint with a burst
        stays; a slow one spills to quarantine), and never buffer more than ``max_queue``."""
        if lane.waiting() >= self.max_queue:
            return True
        ep = self.endpoint(endpoint_id)
        cap = ep.concurrency if ep is not None else 1
        return lane.waiting() >= cap and lane.expected_wait_s(cap) > self.budget_s

    def pump(self, lane: Lane) -> None:
        """Start queued work while the lane's cap and breaker allow."""
        while lane.queue or lane.redrives:
            ep = self.endpoint(lane.endpoint_id)
            strict = self._strict(ep)
            cap = 1 if strict or ep is None else ep.concurrency
            if strict and lane.in_flight:
                return  # one at a time; a divert waits for the one in flight
            now_ms = self._now_ms()
            before = lane.breaker
            decision, state = admit(self.policy, before, now_ms, cap)
            if lane.back_at_ms > now_ms and not strict:  # (strict: its head waits that long)
                due = decision.due_at_ms if isinstance(decision, Divert) else 0
                held = decision.reason if isinstance(decision, Divert) else "retry_after"
                decision, state = Divert(held, max(lane.back_at_ms, due)), before
            if strict and not isinstance(decision, Divert) and self._over_budget(
                    lane, lane.endpoint_id):
                decision = Divert("over_budget", now_ms + int(self.quarantine_delay_s * 1000))
                state = before  # the breaker admitted nothing
            if isinstance(decision, Divert):
                lane.breaker = state
                self._changed(lane, before, own=True)
                self._divert_all(lane, decision, now_ms)
                return
            if lane.in_flight >= decision.concurrency:
                return
            lane.breaker = state
            self._changed(lane, before, own=True)
            work = lane.pop()
            lane.in_flight += 1
            lane.running.add(work.delivery["delivery_id"])
            task = asyncio.get_running_loop().create_task(self._run(lane, work, decision.probe))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def _divert_all(self, lane: Lane, decision: Divert, now_ms: int) -> None:
        if self.strict is not None and self._strict(self.endpoint(lane.endpoint_id)):
            # strict: the oldest goes to quarantine and the rest wait behind it there
            work = lane.pop()
            head: list[Item] = []
            try:
                due = self._divert(head, work.delivery, decision.reason, decision.due_at_ms,
                                   now_ms, work.msg)
            except Exception as exc:  # dead-lettered: resolved, the next one may go
                head, due = self._failed(work.msg, work.delivery, exc), None
            work.slot.finish(head)  # before the ones parked behind it
            if due is None:  # ended at the ceiling: resolved, the next one may go
                self.strict.after(lane, work, head)
            else:
                self.strict.block(lane, work.delivery["delivery_id"],  # (followers ripen
                                  divert_topic(due, now_ms), due, now_ms)  # with it in a tier)
            return
        while lane.queue or lane.redrives:
            work = lane.pop()
            out: list[Item] = []
            try:
                self._divert(out, work.delivery, decision.reason, decision.due_at_ms, now_ms,
                             work.msg)
            except Exception as exc:  # one odd record must not strand the ones behind it
                out = self._failed(work.msg, work.delivery, exc)
            work.slot.finish(out)

    def _divert(self, out: list[Item], d: DeliveryRecord, reason: str, due_at_ms: int,
                now_ms: int, msg: Message | None = None) -> int | None:
        """Quarantine ``d`` (no attempt used) until ``due_at_ms`` or, over budget or behind
        an open breaker, paced behind the endpoint's earlier diverts (core/quarantine.py).
        Returns its due time; None when, back then, it would be past the retry ceiling:
        it is exhausted instead (given ``msg``, what it was read as)."""
        if msg is not None and self.deliverer.past_ceiling(d, due_at_ms):
            self.deliverer.exhaust(out, msg, d, reason, now_ms)  # (no pacing slot taken)
            return None
        QUARANTINED.labels(reason=reason).inc()
        due = due_at_ms
        if reason in _PACED:
            lane = self._lane(d["endpoint_id"])
            ep = self.endpoint(d["endpoint_id"])
            cap = 1 if ep is None or self._strict(ep) else ep.concurrency
            due, lane.paced_until_ms = paced_due(due_at_ms, lane.paced_until_ms, now_ms,
                                                 slot_ms(lane.latency_s, cap))
            if reason == "breaker_open" and ep is not None and ep.disabled_at_ms is None:
                BREAKER_OPEN.labels(endpoint=d["endpoint_id"]).set(1)  # (again, if enabled
                # while open: shown while it diverts)
        if msg is not None and self.deliverer.past_ceiling(d, due):
            self.deliverer.exhaust(out, msg, d, reason, now_ms)
            return None
        self.deliverer.quarantine(out, d, reason, due, now_ms)
        return due

    async def _run(self, lane: Lane, work: Work, probe: bool) -> None:
        out: list[Item] = []
        unhealthy = sent = False
        waited = 0.0
        started = time.monotonic()
        try:
            ep = self.endpoint(lane.endpoint_id)
            why = self._halt(work.delivery)
            if why is not None:  # tripped while this waited in its lane
                self.deliverer.hold(out, work.delivery, why, self._now_ms())
            elif ep is None and self._unseen.not_seen_yet(work.delivery, self._now_ms(),
                                                          self.view_checked_ms):
                self._unseen.divert_unseen(out, work.delivery, self._now_ms())
            elif ep is None:
                exc = DeadLetterError(f"endpoint {lane.endpoint_id} is unknown or disabled")
                now_ms = self._now_ms()
                self.deliverer.dead_letter(out, work.msg, exc, "unknown_endpoint", now_ms,
                                           work.delivery)
                self.deliverer.outcome(out, work.delivery, "dead_lettered", now_ms,
                                       "unknown_endpoint")
            elif ep.disabled_at_ms is not None:  # disabled while this waited in its lane
                self.deliverer.park(out, work.delivery, self._now_ms())
            else:
                self._unseen.seen(work.delivery["delivery_id"])
                sent = True
                result = await self.deliverer.deliver(work.msg, work.delivery, ep, out)
                unhealthy, waited = result.unhealthy, result.waited_s
                lane.back_at_ms = max(lane.back_at_ms, result.back_at_ms)  # Retry-After
        except Exception as exc:  # a bug must not stall the partition: dead-letter it
            out = self._failed(work.msg, work.delivery, exc)
        finally:
            lane.in_flight -= 1
            lane.running.discard(work.delivery["delivery_id"])
            # the endpoint's pace, which its budget and quarantine pacing read: not the
            # agent's own wait on Kafka (in a broker's failover it made every endpoint look
            # seconds slow, quarantined them and spaced their return over minutes)
            lane.observe(time.monotonic() - started - waited)
        before = lane.breaker
        lane.breaker = (on_result(self.policy, before, self._now_ms(), failed=unhealthy,
                                  probe=probe) if sent else unused(before, probe=probe))
        self._changed(lane, before, own=True)
        work.slot.finish(out)  # before anything parked behind it (finishing order)
        if self.strict is not None and lane.endpoint_id in self.strict.states:
            if not self._strict(self.endpoint(lane.endpoint_id)):
                self.strict.unwind(lane)  # no longer strict while this was out
            elif work.slot.detached:  # revoked or aborted meanwhile: the owner redoes it
                self.strict.dropped(lane, work)
            else:
                self.strict.after(lane, work, out)
        self.pump(lane)
        self._forget_if_unknown(lane)

    def _forget_if_unknown(self, lane: Lane) -> None:
        """Drop the idle lane of an endpoint the view does not have (deleted, or an id
        from another producer): one was made for every such id and kept for good."""
        if (lane.queue or lane.redrives or lane.in_flight or lane.breaker.state != "closed"
                or self.endpoint(lane.endpoint_id) is not None
                or (self.strict is not None and lane.endpoint_id in self.strict.states)):
            return
        if self.lanes.get(lane.endpoint_id) is lane:
            del self.lanes[lane.endpoint_id]

    def drop_partitions(self, revoked: set[tuple[str, int]]) -> None:
        """Forget queued work of revoked partitions (their new owner redoes it)."""
        for lane in self.lanes.values():
            lane.queue = deque(
                w for w in lane.queue if (w.msg.topic(), w.msg.partition()) not in revoked
            )
            lane.redrives = deque(
                w for w in lane.redrives if (w.msg.topic(), w.msg.partition()) not in revoked
            )
        if self.strict is not None:
            self.strict.forget(lambda w: (w.msg.topic(), w.msg.partition()) not in revoked,
                               self.lanes, revoked)

    def clear(self) -> None:
        self._unseen.waiting.clear()  # every record consumed comes again, in its order
        for lane in self.lanes.values():
            lane.queue.clear()
            lane.redrives.clear()
        if self.strict is not None:
            self.strict.forget(lambda _w: False, self.lanes)

    def wake(self) -> None:
        """Re-pump every lane (a breaker may have become ready to probe)."""
        for lane in self.lanes.values():
            if self.strict is not None and lane.endpoint_id in self.strict.states:
                if self._strict(self.endpoint(lane.endpoint_id)):
                    self.strict.tick(lane)
                else:
                    self.strict.unwind(lane)
            if lane.queue or lane.redrives:
                self.pump(lane)
