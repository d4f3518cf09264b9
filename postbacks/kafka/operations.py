"""Publishing operational events (``operations.v1``): an endpoint disabled or re-enabled,
and the notifier's events. Each is acknowledged before the caller goes on."""

from __future__ import annotations

from collections.abc import Mapping

from postbacks.codec import codec_for
from postbacks.ids import new_id
from postbacks.kafka.publish import publish_acked
from postbacks.records import OperationalEventRecord
from postbacks.settings import Settings
from topics.registry import TOPICS

__all__ = ["OperationalEvents", "operational_event"]


def operational_event(kind: str, endpoint_id: str | None, app_id: str | None,
                      reason: str | None, now_ms: int, *, actor: str | None = None,
                      detail: Mapping[str, str] | None = None) -> OperationalEventRecord:
    return OperationalEventRecord(
        event_id=new_id("ops", now_ms), kind=kind, endpoint_id=endpoint_id, app_id=app_id,
        occurred_at=now_ms, reason=reason, actor=actor, detail=dict(detail or {}))


class OperationalEvents:
    """Publishes OperationalEvent records keyed by endpoint (``*`` for a global event)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._codec = codec_for("OperationalEvent")

    def publish(self, kind: str, endpoint_id: str | None, app_id: str | None,
                reason: str | None, now_ms: int, *, actor: str | None = None,
                detail: Mapping[str, str] | None = None) -> OperationalEventRecord:
        """Raises ServiceUnavailable when the broker does not acknowledge it."""
        event = operational_event(kind, endpoint_id, app_id, reason, now_ms, actor=actor,
                                  detail=detail)
        publish_acked(self.settings, [(self.settings.topic(TOPICS.operations.base),
                                       (endpoint_id or "*").encode(),
                                       self._codec.encode(event))])
        return event
