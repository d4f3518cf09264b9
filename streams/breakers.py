"""The agents' shared, durable circuit breakers: ``breakers.v1`` (compacted, keyed by
endpoint id, one BreakerState record per transition; core/breaker.py has the rules).

Every agent publishes its own transitions and follows the topic: at start it reads it from
the beginning (the latest transition of every endpoint, kept by compaction) before it sends
anything, so an agent started while an endpoint's breaker is open does not send to it; then
it keeps reading, so a breaker opened by one agent is open in every agent within a poll.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from postbacks.codec import codec_for
from postbacks.core.breaker import BreakerState, from_record, to_record
from postbacks.records import BreakerStateRecord
from postbacks.settings import Settings
from streams.follow import Follower
from streams.intents import DirectLog
from topics import TOPICS
from topics.admin import create_topics

__all__ = ["BreakerFollower", "breaker_publisher"]

Adopt = Callable[[str, BreakerState], None]


def breaker_publisher(direct: DirectLog, actor: str) -> Adopt:
    """Publishes this agent's transitions (no wait: a lost one is superseded by the next,
    and each agent still holds its own state)."""
    codec = codec_for("BreakerState")

    def publish(endpoint_id: str, state: BreakerState) -> None:
        direct.publish(TOPICS.breakers.base, endpoint_id.encode(),
                       codec.encode(to_record(endpoint_id, state, actor)))

    return publish


class BreakerFollower(Follower):
    """Reads ``breakers.v1``; hands every circuit-breaker record to ``adopt`` on the event
    loop, in order (streams/follow.py)."""

    def __init__(self, settings: Settings, loop: asyncio.AbstractEventLoop,
                 adopt: Adopt) -> None:
        create_topics(settings, [TOPICS.breakers])  # idempotent; verifies its configs

        def hand_over(recs: list[BreakerStateRecord]) -> None:
            for rec in recs:
                state = from_record(rec)
                if state is not None:
                    adopt(rec["scope_key"], state)

        super().__init__(settings, loop, TOPICS.breakers, "postbacks-agent-breakers",
                         hand_over)
