"""Attempt intents and their reconciliation: every request sent is in the attempt log. Pure.

Before it sends, the agent produces an *intent* (an Attempt record with result
``sending``) and waits for the broker's acknowledgement; after the response it produces the
attempt's own record with the same ``attempt_id``, in the transaction that commits the
dispatch offset. An intent whose attempt record never comes means the agent stopped between
the two (killed, or its transaction aborted): the request may have reached the receiver.
The sink writes such an intent into the attempt log as result ``unknown``, error class
``agent_lost``, when:

* another agent process attempts the same delivery at or after it: the delivery was
  dispatched again, which happens only when the offset that the attempt's record would
  have been committed with was not (``superseded``); or
* the same dispatch (same delivery, attempt number and trigger) has another attempt on
  record, whoever sent first and whichever process sent it: a partition back to the same
  agent after a rebalance, or a re-send by another agent (``redone``; checked against the
  stored attempts by the sink, :mod:`sinks.intents`); or
* it has waited ``lost_after_ms`` (``no_result``): longer than any send, commit and retry
  of the producing transaction takes.

An attempt record that arrives after its intent was judged lost replaces the ``unknown``
row (the sink deletes it and writes the record): a late record is never dropped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["INTENT", "LOST_CLASS", "UNKNOWN", "Intent", "Lost", "Seen", "lost_intents",
           "lost_message"]

INTENT = "sending"  # the result of an intent record
UNKNOWN = "unknown"  # the result written for an intent judged lost
LOST_CLASS = "agent_lost"


@dataclass(frozen=True, slots=True)
class Intent:
    """An intent with no attempt record yet."""

    attempt_id: str
    delivery_id: str
    attempted_at_ms: int
    agent_instance: str | None


@dataclass(frozen=True, slots=True)
class Seen:
    """An attempt or intent record just read (what may supersede a pending intent)."""

    attempt_id: str
    delivery_id: str
    attempted_at_ms: int
    agent_instance: str | None


@dataclass(frozen=True, slots=True)
class Lost:
    intent: Intent
    reason: str  # superseded | no_result
    by: str | None = None  # the superseding attempt's id


def lost_intents(pending: Iterable[Intent], seen: Iterable[Seen], *, now_ms: int,
                 lost_after_ms: int) -> list[Lost]:
    """The pending intents that are lost now, each once, in ``pending``'s order.

    An intent is superseded only by a record of *another* agent process (one process may
    well send two copies of one delivery at once, a replay beside a retry, and records
    both), and only by one not older than itself. A record or intent with no
    ``agent_instance`` (an agent before v2) supersedes nothing and is superseded by
    nothing: it waits for ``lost_after_ms``."""
    by_delivery: dict[str, list[Seen]] = {}
    for s in seen:
        if s.agent_instance is not None:
            by_delivery.setdefault(s.delivery_id, []).append(s)
    out: list[Lost] = []
    for i in pending:
        rival = None
        if i.agent_instance is not None:
            rival = next((s for s in by_delivery.get(i.delivery_id, ())
                          if s.attempt_id != i.attempt_id
                          and s.agent_instance != i.agent_instance
                          and s.attempted_at_ms >= i.attempted_at_ms), None)
        if rival is not None:
            out.append(Lost(i, "superseded", rival.attempt_id))
        elif now_ms - i.attempted_at_ms >= lost_after_ms:
            out.append(Lost(i, "no_result"))
    return out


def lost_message(lost: Lost) -> str:
    """The error message of the ``unknown`` row written for a lost intent."""
    why = (f"the delivery was attempted again ({lost.by}) by another agent process"
           if lost.reason == "superseded" else "no result was recorded in time")
    agent = lost.intent.agent_instance or "an agent"
    return (f"{agent} stopped after it was about to send; the receiver may have received it"
            f" ({why})")
