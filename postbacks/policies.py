"""Decision policies built from settings (the pure core takes them as plain values)."""

from __future__ import annotations

from postbacks.core.breaker import BreakerPolicy
from postbacks.core.retry import RetryPolicy
from postbacks.settings import Settings, parse_event_type_limits

__all__ = ["breaker_policy", "retry_policy"]


def retry_policy(s: Settings) -> RetryPolicy:
    return RetryPolicy(
        base_s=s.retry_base_s, max_delay_s=s.retry_max_delay_s, ceiling_s=s.retry_ceiling_s,
        max_attempts=s.retry_max_attempts,
        max_attempts_by_event_type=parse_event_type_limits(s.retry_max_attempts_by_event_type),
    )


def breaker_policy(s: Settings) -> BreakerPolicy:
    return BreakerPolicy(
        failure_threshold=s.breaker_failure_threshold, open_s=s.breaker_open_s,
        ramp_s=s.breaker_ramp_s,
    )
