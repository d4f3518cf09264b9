"""Strict per-endpoint ordering: an endpoint with ``"ordering": "strict"`` in its config is
sent one delivery at a time, and no delivery before the one ahead of it is resolved
(delivered, dead-lettered, exhausted, suppressed or held) -- across retries and restarts.

Deliveries of one endpoint reach the agent in order (every delivery topic is keyed by
endpoint id). When a strict endpoint's delivery must wait -- a retry, or a quarantine by
the breaker or the buffer budget -- it becomes the endpoint's **head**, and every later
delivery of that endpoint is **parked behind it in the same delay topic** with the head's
``due_at`` (last_error ``waiting: strict order behind <head>``, no attempt consumed). A
delay topic is read in order per partition by the relay, so the head comes back first and
its followers right behind it. If the head must wait again, in another delay topic, the
followers coming back are parked behind it there; a new delivery arriving before the last
of them is back waits in memory (seconds), so it never overtakes them.

The state (head, its delay topic and due time, the last follower parked and not yet back)
is kept per endpoint in the compacted ``ordering.v1`` (JSON), written in the agent's
transaction with the records and offsets it describes; a restarted agent, or the one a
partition moves to, reads it before sending. A head or follower not back within
``grace_ms`` of its due time (lost to an operator action, or a state written beyond the
offset tracker's span) stops blocking, with a warning.

What strict costs: one request at a time (the endpoint's concurrency is 1), and head-of-line
blocking -- a delivery that keeps failing blocks every later one for its whole retry
schedule, and a poison payload holds the endpoint until it is dead-lettered.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from postbacks.codec import codec_for
from postbacks.kafka.clients import make_consumer
from postbacks.kafka.stable import wait_stable
from postbacks.metrics import STRICT_WAITING
from postbacks.records import DeliveryRecord
from postbacks.settings import Settings
from streams.delivery import Deliverer
from streams.lane import Lane, Work
from streams.offsets import Item
from topics import TOPICS

__all__ = ["MARK", "OrderState", "StrictOrder", "load_states"]

log = logging.getLogger(__name__)

MARK = "waiting: strict order"
DELAY_TOPICS = frozenset({*(t.base for t in TOPICS.retry), TOPICS.quarantine.base})


@dataclass(slots=True)
class OrderState:
    head: str | None = None  # the delivery every later one waits for
    topic: str | None = None  # the delay topic it waits in (its followers behind it)
    due_at: int = 0
    tail: str | None = None  # the last follower parked behind it, not seen back yet
    drain: str | None = None  # the last follower parked in an earlier delay topic, not back
    drain_due: int = 0
    # when the head entered its delay topic: its followers carry it, so in a retry tier
    # they ripen (and hop) with the head, not after a follower parked later (0: unknown)
    enqueued: int = 0
    here: bool = False  # (memory) the head is in this agent's lane now
    waiting: deque[Work] = field(default_factory=deque)  # (memory) new ones held back
    partition: tuple[str, int] | None = None  # (memory) where its deliveries are read
    revoked: bool = False  # (memory) that partition was revoked with its head in flight

    def idle(self) -> bool:
        return not self.here and not self.waiting

    def dump(self) -> bytes:
        return json.dumps({"head": self.head, "topic": self.topic, "due_at": self.due_at,
                           "tail": self.tail, "drain": self.drain,
                           "drain_due": self.drain_due, "enqueued": self.enqueued},
                          sort_keys=True).encode()

    @classmethod
    def load(cls, raw: bytes) -> OrderState:
        """A state as :meth:`dump` wrote it; ValueError for anything else (another
        producer's record: a number where a name goes, ``1e400``, nesting)."""
        try:
            d = json.loads(raw)
        except RecursionError as exc:
            raise ValueError("nested too deeply") from exc
        if not isinstance(d, dict):
            raise ValueError("not an object")
        return cls(_name(d, "head"), _name(d, "topic"), _instant(d, "due_at"), _name(d, "tail"),
                   _name(d, "drain"), _instant(d, "drain_due"), _instant(d, "enqueued"))


def _name(d: dict[str, object], key: str) -> str | None:
    v = d.get(key)
    if v is None or isinstance(v, str):
        return v
    raise ValueError(f"{key} is {type(v).__name__}, not a string")


def _instant(d: dict[str, object], key: str) -> int:
    v = d.get(key)
    if v is None:
        return 0
    if type(v) is not int or not 0 <= v < 2**63:
        raise ValueError(f"{key} is {v!r}, not a time in milliseconds")
    return v


def load_states(settings: Settings, timeout_s: float = 30.0) -> dict[str, OrderState]:
    """Every endpoint's committed state: ``ordering.v1`` read from the start to its end."""
    import time

    consumer = make_consumer(settings, "postbacks-agent-ordering",
                             **{"enable.partition.eof": True})
    out: dict[str, OrderState] = {}
    try:
        topic = settings.topic(TOPICS.ordering.base)
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        # an agent killed mid-commit leaves its transaction open: the states committed
        # after its first record would be read only once it is aborted
        wait_stable(settings, topic, sorted(parts))
        left = set(parts)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        deadline = time.monotonic() + timeout_s
        while left:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic} not read to its end within {timeout_s:.0f} s")
            for m in consumer.consume(500, 0.2):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        left.discard(m.partition() or 0)
                    continue
                key = (m.key() or b"").decode(errors="replace")  # (no endpoint's, if odd)
                if m.value() is None:
                    out.pop(key, None)
                    continue
                try:
                    out[key] = OrderState.load(m.value() or b"")
                except (ValueError, TypeError) as exc:
                    log.warning("ordering: unreadable state of %s (%s): ignored", key, exc)
    finally:
        consumer.close()
    return out


@dataclass
class StrictOrder:
    deliverer: Deliverer
    now_ms: Callable[[], int]
    grace_ms: int = 600_000
    states: dict[str, OrderState] = field(default_factory=dict)
    dirty: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._dlv = codec_for("Delivery")
        STRICT_WAITING.set_function(lambda: sum(len(s.waiting) for s in self.states.values()))

    def _state(self, endpoint_id: str) -> OrderState:
        st = self.states.get(endpoint_id)
        if st is None:
            st = self.states[endpoint_id] = OrderState()
        return st

    # -- arrivals ------------------------------------------------------------------------
    def submit(self, lane: Lane, work: Work) -> None:
        """A consumed delivery of a strict endpoint: to the lane, parked, or held back."""
        eid, d = lane.endpoint_id, work.delivery
        st = self._state(eid)
        st.partition = (work.msg.topic() or "", work.msg.partition() or 0)
        did = d["delivery_id"]
        marked = (d["last_error"] or "").startswith(MARK)
        if marked and did in (st.tail, st.drain):
            if did == st.tail:
                st.tail = None
            if did == st.drain:
                st.drain = None
            self.dirty.add(eid)
        if did == st.head:
            st.here = True
            lane.queue.append(work)
        elif st.head is not None and not st.here:
            if marked or st.drain is None:
                self._park(eid, st, work)
            else:
                st.waiting.append(work)  # behind followers still coming back
        elif st.head is not None:  # the head is being sent: its followers queue behind it
            (lane.queue if marked else st.waiting).append(work)
        elif marked or (st.drain is None and not st.waiting):
            lane.queue.append(work)
        else:
            st.waiting.append(work)
        self._release(lane, st)

    def _park(self, eid: str, st: OrderState, work: Work) -> None:
        d = work.delivery
        assert st.topic is not None and st.head is not None
        out: list[Item] = []
        now = self.now_ms()
        try:
            already = (d["last_error"] or "").startswith(MARK)
            parked = DeliveryRecord(**{**d, "due_at": st.due_at,
                                       "enqueued_at": st.enqueued or now,
                                       "last_error": f"{MARK} behind {st.head}"})
            out.append((st.topic, eid.encode(), self._dlv.encode(parked)))
            if not already:
                self.deliverer.outcome(out, d, "quarantined", now,
                                       f"strict_order: waiting behind {st.head}")
        except Exception as exc:  # one odd record must not strand the ones behind it
            log.exception("ordering: could not park %s", d["delivery_id"])
            out = []
            self.deliverer.dead_letter(out, work.msg, exc, "internal_error", now, d)
            work.slot.finish(out)  # (dead-lettered: nothing of it is out to wait for)
            return
        st.tail = d["delivery_id"]
        self.dirty.add(eid)
        work.slot.finish(out)

    def _release(self, lane: Lane, st: OrderState) -> None:
        """Held-back deliveries go on once nothing they must follow is still out."""
        if not st.waiting or st.drain is not None:
            return
        if st.head is None and st.tail is None:
            lane.queue.extend(st.waiting)
            st.waiting.clear()
        elif st.head is not None and not st.here:
            while st.waiting:
                self._park(lane.endpoint_id, st, st.waiting.popleft())

    # -- results -------------------------------------------------------------------------
    def after(self, lane: Lane, work: Work, out: list[Item]) -> None:
        """A strict delivery's attempt finished with ``out``: it blocks, or it is resolved."""
        eid, did = lane.endpoint_id, work.delivery["delivery_id"]
        st = self._state(eid)
        if did == st.head:
            st.here = False
        for topic, _key, value in out:
            if topic in DELAY_TOPICS:
                rec = self._dlv.decode(value)
                self.block(lane, did, topic, int(rec["due_at"] or self.now_ms()),
                           int(rec["enqueued_at"] or 0))
                return
        if did == st.head:
            st.head, st.topic = None, None
            if st.tail is not None:
                st.drain, st.drain_due, st.tail = st.tail, st.due_at, None
            self.dirty.add(eid)
        self._release(lane, st)

    def block(self, lane: Lane, did: str, topic: str, due_at: int, enqueued: int = 0) -> None:
        """``did`` now waits in ``topic`` until ``due_at`` (entered it at ``enqueued``):
        everything queued behind it is parked there, after it."""
        st = self._state(lane.endpoint_id)
        if st.tail is not None:  # followers of an earlier wait, still coming back
            st.drain, st.drain_due = st.tail, st.due_at
        st.head, st.topic, st.due_at, st.tail, st.here = did, topic, due_at, None, False
        st.enqueued = enqueued
        self.dirty.add(lane.endpoint_id)
        while lane.queue:
            self._park(lane.endpoint_id, st, lane.queue.popleft())
        self._release(lane, st)

    def tick(self, lane: Lane) -> None:
        """Once a second: give up on a head or follower that is long overdue. Only for
        an endpoint whose deliveries this agent reads (a state loaded from ordering.v1 for
        another agent's partition, or one of a revoked partition, is not this agent's to
        change and publish: it overwrote the owner's)."""
        st = self.states.get(lane.endpoint_id)
        if st is None or st.partition is None or st.revoked:
            return
        now = self.now_ms()
        if st.head is not None and not st.here and now > st.due_at + self.grace_ms:
            log.warning("strict order %s: %s not back %d s after its due time; going on",
                        lane.endpoint_id, st.head, (now - st.due_at) // 1000)
            if st.tail is not None:
                st.drain, st.drain_due = st.tail, st.due_at
            st.head = st.topic = st.tail = None
            self.dirty.add(lane.endpoint_id)
        if st.drain is not None and now > st.drain_due + self.grace_ms:
            log.warning("strict order %s: follower %s not back; going on", lane.endpoint_id,
                        st.drain)
            st.drain = None
            self.dirty.add(lane.endpoint_id)
        self._release(lane, st)

    def unwind(self, lane: Lane) -> None:
        """The endpoint is no longer strict (its ``ordering`` changed, or it was deleted):
        once its head is not being sent, what was held back goes to its lane, and its state
        is cleared and published cleared. Until then its in-flight head still counted as
        here, no later delivery was released, and its partition's offsets stayed behind
        the first one held back for ever."""
        st = self.states.get(lane.endpoint_id)
        if st is None or st.partition is None or st.revoked or (
                st.head is not None and st.head in lane.running):
            return  # (not this agent's to change; or the head's answer still to come)
        lane.queue.extend(st.waiting)
        st.waiting.clear()
        st.here = False
        if (st.head, st.topic, st.tail, st.drain) != (None, None, None, None):
            st.head = st.topic = st.tail = st.drain = None
            st.due_at = st.drain_due = st.enqueued = 0
            self.dirty.add(lane.endpoint_id)

    # -- state ---------------------------------------------------------------------------
    def dropped(self, lane: Lane, work: Work) -> None:
        """A strict delivery sent while its partition was revoked (or its batch aborted):
        its outputs are dropped and the partition's owner redoes it, so the order state is
        not changed (publishing it would overwrite the owner's). A state of a revoked
        partition goes; otherwise the head is no longer here, unless a copy read again is
        queued (the partition came back, or the batch is read again)."""
        eid, did = lane.endpoint_id, work.delivery["delivery_id"]
        st = self.states.get(eid)
        if st is None or st.head != did:
            return
        if st.revoked:
            del self.states[eid]
            self.dirty.discard(eid)
        elif not any(w.delivery["delivery_id"] == did for w in (*lane.queue, *lane.redrives)):
            st.here = False

    def take_writes(self) -> list[Item]:
        """The ``ordering.v1`` records of the states changed since the last call."""
        out: list[Item] = [(TOPICS.ordering.base, eid.encode(), self.states[eid].dump())
               for eid in sorted(self.dirty) if eid in self.states]
        self.dirty.clear()
        return out

    def adopt(self, loaded: dict[str, OrderState]) -> None:
        """Committed states (at start, or for partitions just assigned); an endpoint with
        work in this agent keeps its own, newer one."""
        for eid, st in loaded.items():
            mine = self.states.get(eid)
            if mine is None or mine.idle() or mine.revoked:
                self.states[eid] = st

    def forget(self, keep: Callable[[Any], bool], lanes: Mapping[str, Lane],
               revoked: set[tuple[str, int]] | None = None) -> None:
        """Drop held-back work of revoked partitions (``keep(work)`` false); a head whose
        work was dropped from its lane is no longer here. The states of ``revoked``
        partitions go, unpublished (the records they describe were dropped with their
        slots): the next owner's are the true ones; one whose head is in flight goes when
        its answer comes (:meth:`dropped`)."""
        for eid, st in list(self.states.items()):
            st.waiting = deque(w for w in st.waiting if keep(w))
            lane = lanes.get(eid)
            if st.here and (lane is None or (not lane.in_flight and not any(
                    w.delivery["delivery_id"] == st.head for w in lane.queue))):
                st.here = False
            if revoked is not None and st.partition in revoked:
                self.dirty.discard(eid)
                if st.here:
                    st.revoked = True
                else:
                    del self.states[eid]

    def reset(self, loaded: dict[str, OrderState]) -> None:
        """After an aborted transaction: only the committed states are true."""
        self.states = dict(loaded)
        self.dirty.clear()
