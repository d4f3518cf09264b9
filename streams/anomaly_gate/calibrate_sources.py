"""Where ``postbacks anomaly calibrate`` reads a history from, for either scope: the
record's event-time minute and payout, and ``deliveries.v1`` by time range."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from postbacks.core.instants import InstantError, parse_instant
from postbacks.settings import Settings

__all__ = ["iso", "minute_of", "parse_ms", "read_range"]


def parse_ms(text: str | None, what: str) -> int | None:
    if text is None:
        return None
    try:
        return parse_instant(text, what)
    except InstantError as exc:
        raise ValueError(str(exc)) from None


def iso(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")


def minute_of(occurred_at: object, payout: object) -> tuple[int, int] | None:
    """(event-time minute, payout micros) of one record; None when either is unusable
    (the gate holds those under enforce as missing inputs; they carry no rate)."""
    if type(payout) is not int or payout < 0:
        return None
    try:
        return parse_instant(occurred_at, "occurred_at") // 60_000, payout
    except InstantError:
        return None


def read_range(settings: Settings, since: int, until: int) -> Iterator[dict[str, Any]]:
    """Deliveries produced to ``deliveries.v1`` in [since, until) (record timestamps); an
    undecodable record is skipped (the gate would not count it either)."""
    from postbacks.codec import codec_for
    from postbacks.errors import DeadLetterError
    from postbacks.kafka.time_range import read_time_range
    from topics import TOPICS

    codec = codec_for("Delivery")
    for m in read_time_range(settings, settings.topic(TOPICS.deliveries.base), since, until,
                             group_id="postbacks-calibrate"):
        try:
            yield dict(codec.decode(m.value() or b""))
        except DeadLetterError:
            continue
