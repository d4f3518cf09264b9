"""Topic registry and the ``topics create|verify`` command."""

from topics.registry import (
    GATE_APP,
    GROUPS,
    RETRY_TIERS,
    TOPICS,
    GroupSpec,
    TopicSpec,
    all_topics,
    internal_topics,
)

__all__ = ["GATE_APP", "GROUPS", "RETRY_TIERS", "TOPICS", "GroupSpec", "TopicSpec", "all_topics",
           "internal_topics"]
