"""One endpoint's lane in the agent (see lanes.py): its queued work, in-flight count,
breaker and pace."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from confluent_kafka import Message

from postbacks.core.breaker import BreakerState
from postbacks.records import DeliveryRecord
from streams.offsets import Slot

__all__ = ["REDRIVES", "REDRIVE_SHARE", "Lane", "Work"]


@dataclass(slots=True)
class Work:
    msg: Message
    delivery: DeliveryRecord
    slot: Slot


REDRIVES = frozenset({"manual", "release"})  # console replays and held releases
REDRIVE_SHARE = 4  # with both kinds waiting, every 4th start is a re-drive


@dataclass(slots=True)
class Lane:
    """One endpoint's work. Re-drives (replays, releases) wait in their own queue and get
    every :data:`REDRIVE_SHARE`-th free slot while first attempts and retries wait, so a
    bulk replay never delays an endpoint's live traffic by more than a quarter of its cap
    (and is never starved: offsets commit only past finished work)."""

    endpoint_id: str
    queue: deque[Work] = field(default_factory=deque)
    redrives: deque[Work] = field(default_factory=deque)
    in_flight: int = 0
    running: set[str] = field(default_factory=set)  # the delivery ids being sent now
    starts: int = 0
    breaker: BreakerState = field(default_factory=BreakerState)
    latency_s: float = 0.0  # EWMA of attempt durations (0 = none finished yet)
    paced_until_ms: int = 0  # where the next paced divert may come back (core/quarantine.py)
    # The endpoint's Retry-After on a 429 or 503 (seed 003: "the most useful signal it will
    # ever get"): nothing more is sent to it before then; new work waits in quarantine.
    back_at_ms: int = 0

    def observe(self, seconds: float, alpha: float = 0.2) -> None:
        self.latency_s = seconds if self.latency_s == 0 else (
            alpha * seconds + (1 - alpha) * self.latency_s)

    def waiting(self) -> int:
        return len(self.queue) + len(self.redrives)

    def push(self, work: Work) -> None:
        (self.redrives if work.delivery["trigger"] in REDRIVES else self.queue).append(work)

    def pop(self) -> Work:
        self.starts += 1
        if self.redrives and (not self.queue or self.starts % REDRIVE_SHARE == 0):
            return self.redrives.popleft()
        return self.queue.popleft()

    def expected_wait_s(self, cap: int) -> float:
        """How long the newest queued delivery would wait at the current pace."""
        return (self.waiting() + self.in_flight) * self.latency_s / max(1, cap)
