"""Topic registry and the ``topics create|verify`` command."""

from topics.registry import RETRY_TIERS, TOPICS, TopicSpec, all_topics

__all__ = ["RETRY_TIERS", "TOPICS", "TopicSpec", "all_topics"]
