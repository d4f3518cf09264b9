"""The event types an endpoint may subscribe to.

A conversion's ``event_type`` (schemas/avro/conversion_event.*.avsc) names what happened;
an endpoint's ``event_types`` name the ones it is sent, ``*`` for all. A subscription to a
name no conversion carries would never deliver anything, so it is refused on save
(:func:`event_type_problems`, run by :func:`postbacks.core.endpoint_check.endpoint_problems`
next to the provider's macro checks).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ALL", "EVENT_TYPES", "event_type_problems"]

ALL = "*"

# What the product emits: a completed conversion, progress toward a goal (``progress`` in
# the retry caps), a reward, an install, and ``superseded`` (a later event replaced it).
EVENT_TYPES: frozenset[str] = frozenset(
    {"conversion", "goal_progress", "progress", "reward", "install", "superseded"})


def event_type_problems(event_types: Iterable[str]) -> list[str]:
    """One problem naming every unknown event type in ``event_types``, or ``[]``."""
    unknown = sorted({t for t in event_types if t != ALL and t not in EVENT_TYPES})
    if not unknown:
        return []
    return [f"unknown event type(s): {', '.join(repr(t) for t in unknown)} (known: "
            f"{', '.join(sorted(EVENT_TYPES))}, or {ALL} for all)"]
