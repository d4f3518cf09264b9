"""Deliveries whose endpoint the agent's endpoint view lacks, perhaps only for not having
been refreshed since (a new, re-created or re-enabled endpoint): each waits
:data:`UNSEEN_S` in quarantine, no attempt used, until the view has been refreshed since it
first missed it; only then is it dead-lettered as unknown. While some of an endpoint's are
out, its later deliveries follow them (the endpoint may order its deliveries strictly)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from postbacks.core.quarantine import UNSEEN
from postbacks.records import DeliveryRecord
from streams.offsets import Item

__all__ = ["UNSEEN_GRACE_MS", "UNSEEN_S", "Unseen"]

UNSEEN_S = 2.0  # how long a delivery whose endpoint is not seen yet waits (the view is
# refreshed meanwhile)
UNSEEN_GRACE_MS = 60_000  # one not back this long after its due time is given up on
_FIRST_MISS_MAX = 10_000

# (out, delivery, reason, due_at_ms, now_ms) -> its due time: the lanes' quarantine divert
Divert = Callable[[list[Item], DeliveryRecord, str, int, int], int | None]


@dataclass
class Unseen:
    divert: Divert
    # endpoint -> its deliveries diverted as not seen yet, not back: id -> due time
    waiting: dict[str, dict[str, int]] = field(default_factory=dict)
    first_miss: dict[str, int] = field(default_factory=dict)  # id -> when first missed

    def not_seen_yet(self, d: DeliveryRecord, now_ms: int,
                     view_checked_ms: Callable[[], int] | None) -> bool:
        """Whether the view may lack ``d``'s endpoint only for not having been refreshed
        since this agent first missed it (``view_checked_ms``: when the view was last known
        current; None: a missing endpoint is gone at once)."""
        if view_checked_ms is None:
            return False
        if len(self.first_miss) > _FIRST_MISS_MAX:  # ids that never came back
            self.first_miss = {k: t for k, t in self.first_miss.items()
                               if t > now_ms - UNSEEN_GRACE_MS}
        first = self.first_miss.setdefault(d["delivery_id"], now_ms)
        if view_checked_ms() <= first:
            return True
        del self.first_miss[d["delivery_id"]]
        return False

    def seen(self, delivery_id: str) -> None:
        self.first_miss.pop(delivery_id, None)

    def divert_unseen(self, out: list[Item], d: DeliveryRecord, now_ms: int) -> None:
        """Quarantine ``d``, whose endpoint is not in the view yet, behind any of the
        endpoint's diverted so before it (they come back in the order they left)."""
        waiting = self.waiting.setdefault(d["endpoint_id"], {})
        due = max(now_ms + int(UNSEEN_S * 1000), max(waiting.values(), default=0) + 1)
        back = self.divert(out, d, UNSEEN, due, now_ms)
        assert back is not None  # (no message: never ended here)
        waiting[d["delivery_id"]] = back

    def behind(self, out: list[Item], d: DeliveryRecord, now_ms: int) -> bool:
        """While deliveries of ``d``'s endpoint diverted as not seen yet are still out,
        ``d`` follows them to quarantine (True), seen or not, so it cannot overtake them --
        the endpoint may order its deliveries strictly. One of them coming back goes on."""
        waiting = self.waiting.get(d["endpoint_id"])
        if not waiting:
            return False
        if d["delivery_id"] in waiting or now_ms > max(waiting.values()) + UNSEEN_GRACE_MS:
            waiting.pop(d["delivery_id"], None)
            if not waiting or now_ms > max(waiting.values()) + UNSEEN_GRACE_MS:
                del self.waiting[d["endpoint_id"]]  # all back, or given up on
            return False
        self.divert_unseen(out, d, now_ms)
        return True
