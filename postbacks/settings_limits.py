"""Upper and lower bounds of settings whose type allows values that break a stage later.

Each bound is where a value stops working, not a taste: a divert due more than 73 h ahead
is refused by the relay (:data:`postbacks.core.delay.MAX_AHEAD_MS`), a consumer takes at
most 1,000,000 records per call (the sink asks for four batches at once), a watchdog
shorter than a second restarts a stage on its first transaction, and Kafka names topics
with ``[A-Za-z0-9._-]`` only, 249 characters at most.
"""

from __future__ import annotations

import re
from typing import Protocol

from postbacks.core.ssrf import parse_networks
from postbacks.errors import ConfigError

__all__ = ["MAX_AHEAD_S", "MAX_BATCH_SIZE", "MAX_TOPIC_PREFIX", "Limited", "validate_limits"]

MAX_AHEAD_S = 72 * 3600  # a retry ceiling, a breaker's open time, a quarantine delay
MAX_BATCH_SIZE = 250_000  # x4 (the sink's read) stays within librdkafka's 1,000,000
MAX_TOPIC_PREFIX = 100  # leaves the longest topic and changelog names within 249
_TOPIC_CHARS = re.compile(r"[A-Za-z0-9._-]*")


class Limited(Protocol):
    """The settings bounded here (:class:`postbacks.settings.Settings` has them)."""

    @property
    def retry_ceiling_s(self) -> float: ...
    @property
    def breaker_open_s(self) -> float: ...
    @property
    def quarantine_delay_s(self) -> float: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def stall_restart_s(self) -> float: ...
    @property
    def topic_prefix(self) -> str: ...
    @property
    def deny_networks(self) -> str: ...


def validate_limits(s: Limited) -> None:
    """Raise :class:`ConfigError` naming the variable of the first value out of bounds."""
    for var, value in (("POSTBACKS_RETRY_CEILING_S", s.retry_ceiling_s),
                       ("POSTBACKS_BREAKER_OPEN_S", s.breaker_open_s),
                       ("POSTBACKS_QUARANTINE_DELAY_S", s.quarantine_delay_s)):
        if value > MAX_AHEAD_S:
            raise ConfigError(f"{var} must be at most 72 h ({MAX_AHEAD_S}): the relay refuses "
                              "a record due further ahead, as a wrong clock")
    if s.batch_size > MAX_BATCH_SIZE:
        raise ConfigError(f"POSTBACKS_BATCH_SIZE must be at most {MAX_BATCH_SIZE} (the sink "
                          "reads four batches in one call, at most 1,000,000 records)")
    if s.stall_restart_s < 1:
        raise ConfigError("POSTBACKS_STALL_RESTART_S must be at least 1 (seconds a Kafka call "
                          "may hang before the stage restarts in place)")
    try:
        parse_networks(s.deny_networks)
    except ValueError as exc:
        raise ConfigError(f"POSTBACKS_DENY_NETWORKS: {exc}") from None
    if len(s.topic_prefix) > MAX_TOPIC_PREFIX or not _TOPIC_CHARS.fullmatch(s.topic_prefix):
        raise ConfigError(f"POSTBACKS_TOPIC_PREFIX={s.topic_prefix[:40]!r}: Kafka topic names "
                          f"take letters, digits, '.', '_' and '-' only (at most "
                          f"{MAX_TOPIC_PREFIX} characters here)")
