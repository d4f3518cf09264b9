"""The anomaly halts in the agent: what is still to be sent in a tripped scope is held.

The gate holds what it reads from a tripped scope; deliveries already past it -- waiting
in a retry tier or in quarantine, queued in an agent's lane -- reach the agent later.
Every agent follows ``anomaly.control.v1`` from its beginning (streams/follow.py) into the
same :class:`~postbacks.core.anomaly.halts.HaltBook` the gates keep, with the same
refusals, and holds a delivery of a tripped scope instead of sending it: to ``held.v1``
with hold reason ``halted_global`` or ``halted_endpoint``, for review like the gate's
holds. While the global scope is tripped nothing is sent but re-drives a person chose
(console replays and held releases: trigger ``manual`` or ``release``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from postbacks.core.anomaly import GLOBAL_SCOPE, HoldReason
from postbacks.core.anomaly.halts import (
    CONTROL_AHEAD_MS,
    HaltBook,
    StartRefusals,
    read_change,
    refusal,
)
from postbacks.metrics import CONTROL_REFUSED, child
from postbacks.records import BreakerStateRecord
from postbacks.settings import Settings
from streams.follow import Follower
from topics import TOPICS
from topics.admin import create_topics

__all__ = ["AgentHalts", "follow_halts"]

log = logging.getLogger(__name__)

_GLOBAL = HoldReason.HALTED_GLOBAL.value
_ENDPOINT = HoldReason.HALTED_ENDPOINT.value


class AgentHalts:
    """The halts this agent honours (read from the control topic)."""

    def __init__(self, global_key: str, clock: Callable[[], float] = time.time) -> None:
        self.global_key = global_key
        self.clock = clock
        self.book = HaltBook()
        self._later: dict[tuple[str, str, str], BreakerStateRecord] = {}  # refused: dated ahead
        # counted once: while the topic is read from its beginning (:meth:`catching_up`
        # to :meth:`caught_up`), only those still their key's latest change
        self._refusals: StartRefusals[tuple[str, str, str]] = StartRefusals()

    def reason(self, endpoint_id: str) -> str | None:
        """The hold reason for a delivery to ``endpoint_id`` now, or None: send it."""
        halts = self.book.halts
        if not halts:
            return None
        if GLOBAL_SCOPE in halts:
            return _GLOBAL
        return _ENDPOINT if ("endpoint", endpoint_id) in halts else None

    def apply(self, recs: list[BreakerStateRecord]) -> None:
        now_ms = int(self.clock() * 1000)
        for rec in recs:
            self._refusals.replaced((rec["scope"], rec["scope_key"], rec["detector"]))
            self._one(rec, now_ms)

    def catching_up(self) -> None:
        self._refusals.begin()

    def caught_up(self) -> None:
        """Count the refusals read at start that are still their key's latest change."""
        for reason in self._refusals.end():
            child(CONTROL_REFUSED, reason).inc()

    def recheck(self) -> None:
        """Honour the changes refused as dated ahead whose date has come (a close from a
        host whose clock runs ahead: refused for ever, it held every delivery the gates,
        which re-read PostgreSQL, pass again)."""
        if not self._later:
            return
        now_ms = int(self.clock() * 1000)
        for key, rec in list(self._later.items()):
            if rec["changed_at"] <= now_ms + CONTROL_AHEAD_MS:
                del self._later[key]
                self._one(rec, now_ms)

    def _one(self, rec: BreakerStateRecord, now_ms: int) -> None:
        try:
            change = read_change(rec, self.global_key, now_ms)
        except ValueError:
            log.error("anomaly control: unknown state %r ignored", rec["state"][:40])
            return
        if change is None:
            return  # another deployment's global scope
        if isinstance(change, str):
            log.error("%s", refusal(rec, change))
            key = (rec["scope"], rec["scope_key"], rec["detector"])
            for reason in self._refusals.refused(key, change):
                child(CONTROL_REFUSED, reason).inc()
            if change == "dated_ahead" and (  # honoured when its date comes (:meth:`recheck`)
                    key not in self._later or self._later[key]["changed_at"] < rec["changed_at"]):
                self._later[key] = rec
            return
        if self.book.apply(change):
            scope = change.scope
            tripped = scope in self.book.halts
            log.warning("agent: halt %s/%s is now %s: its deliveries %s", rec["scope"],
                        rec["scope_key"][:80], "tripped" if tripped else "closed",
                        "are held" if tripped else "go out again")


def follow_halts(settings: Settings, loop: asyncio.AbstractEventLoop,
                 halts: AgentHalts) -> Follower:
    """Start following ``anomaly.control.v1`` into ``halts``."""
    create_topics(settings, [TOPICS.anomaly_control])  # idempotent; verifies its configs
    halts.catching_up()
    follower = Follower(settings, loop, TOPICS.anomaly_control, "postbacks-agent-halts",
                        halts.apply)

    async def settle() -> None:
        await follower.caught_up.wait()
        halts.caught_up()

    task = loop.create_task(settle())
    _SETTLING.add(task)
    task.add_done_callback(_SETTLING.discard)
    return follower


_SETTLING: set[asyncio.Task[None]] = set()  # (a task is kept only while referenced)
