"""Topic registry and the ``topics create|verify`` command."""

from topics.registry import GROUPS, RETRY_TIERS, TOPICS, GroupSpec, TopicSpec, all_topics

__all__ = ["GROUPS", "RETRY_TIERS", "TOPICS", "GroupSpec", "TopicSpec", "all_topics"]
