from __future__ import annotations

import pytest

from postbacks.core.classify import Delivered, HttpResult, Permanent, Retryable, classify
from postbacks.core.retry import DeadLetter, RetryPolicy, ScheduleRetry, next_step, tier_for


@pytest.mark.parametrize(
    ("result", "verdict"),
    [
        (HttpResult(200), Delivered(200)),
        (HttpResult(204), Delivered(204)),
        (HttpResult(None, "timeout"), Retryable("timeout")),
        (HttpResult(None, "connection_error"), Retryable("connection_error")),
        (HttpResult(500), Retryable("http_500")),
        (HttpResult(503, retry_after_s=7), Retryable("http_503", 7)),
        (HttpResult(502, retry_after_s=7), Retryable("http_502", None)),
        (HttpResult(408), Retryable("http_408")),
        (HttpResult(429, retry_after_s=3), Retryable("http_429", 3)),
        (HttpResult(429, retry_after_s=99999), Retryable("http_429", 3600)),
        (HttpResult(404), Permanent("http_404")),
        (HttpResult(400), Permanent("http_400")),
        (HttpResult(301), Permanent("http_301")),
        (HttpResult(599), Retryable("http_599")),
        (HttpResult(600), Permanent("http_600")),  # no class: not a server error
        (HttpResult(999, retry_after_s=5), Permanent("http_999")),
    ],
)
def test_classification(result: HttpResult, verdict: object) -> None:
    assert classify(result) == verdict


P = RetryPolicy()


@pytest.mark.parametrize(("attempt", "delay"), [(1, 5), (2, 10), (3, 20), (4, 40), (13, 20480),
                                                (14, 21600), (30, 21600)])
def test_exponential_delay_capped_at_six_hours(attempt: int, delay: float) -> None:
    assert P.delay_s(attempt) == delay


@pytest.mark.parametrize("rand", [0.0, 0.3, 0.999])
def test_retry_is_never_earlier_than_scheduled(rand: float) -> None:
    step = next_step(P, attempt_no=2, event_type="conversion", first_attempt_ms=0,
                     now_ms=1000, retry_after_s=None, rand=rand)
    assert isinstance(step, ScheduleRetry)
    assert 1000 + 10_000 <= step.due_at_ms <= 1000 + 12_000


def test_jitter_spreads_a_burst() -> None:
    dues = {next_step(P, attempt_no=1, event_type="c", first_attempt_ms=0, now_ms=0,
                      retry_after_s=None, rand=r / 100).due_at_ms for r in range(100)}
    assert len(dues) > 50


def test_retry_after_raises_the_delay() -> None:
    step = next_step(P, attempt_no=1, event_type="c", first_attempt_ms=0, now_ms=0,
                     retry_after_s=120, rand=0.0)
    assert step == ScheduleRetry("2m", 120_000)


def test_ceiling_and_max_attempts_exhaust() -> None:
    day = 24 * 3600 * 1000
    assert next_step(P, attempt_no=14, event_type="c", first_attempt_ms=0, now_ms=day - 1000,
                     retry_after_s=None, rand=0) == DeadLetter("exhausted")
    per_type = RetryPolicy(max_attempts_by_event_type={"superseded": 1})
    assert next_step(per_type, attempt_no=1, event_type="superseded", first_attempt_ms=0,
                     now_ms=0, retry_after_s=None, rand=0) == DeadLetter("exhausted")


@pytest.mark.parametrize(("delay", "tier"), [(1, "5s"), (5, "5s"), (29, "5s"), (30, "30s"),
                                              (200, "2m"), (7200, "1h"), (30000, "6h")])
def test_tier_choice(delay: float, tier: str) -> None:
    assert tier_for(delay) == tier


@pytest.mark.parametrize("attempt_no", [-2**31, -1, 0])
def test_an_attempt_below_one_keeps_the_backoff(attempt_no: int) -> None:
    """From another producer: an attempt below 1 used to give no delay at all (a tight
    retry loop on the endpoint, the attempt limit never reached)."""
    now = 1_800_000_000_000
    step = next_step(RetryPolicy(jitter=0.0), attempt_no=attempt_no, event_type="c",
                     first_attempt_ms=now, now_ms=now, retry_after_s=None, rand=0.0)
    assert isinstance(step, ScheduleRetry) and step.due_at_ms - now == 5000



@pytest.mark.parametrize(("value", "seconds"), [
    ("7", 7.0), (" 12 ", 12.0), ("7.5", 7.5),
    ("Sun, 06 Dec 2026 21:00:00 GMT", 1800.0),  # an HTTP-date: from now
    ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # one already past: at once
    ("99999999999999999999", 1e15),  # (clamped by classify)
    ("0000000000000005", 5.0), ("0", 0.0), ("0.5", 0.5),
    ("3_000", None), ("1e3", None), ("-5", None), ("nan", None), ("inf", None),
    ("soon", None), ("", None), (None, None),
])
def test_retry_after_takes_seconds_or_an_http_date(value: str | None,
                                                   seconds: float | None) -> None:
    """RFC 9110 10.2.3: delay-seconds or an HTTP-date. The date form used to be ignored
    (a 429's wait lost), and Python's float() took '3_000' and 'nan'."""
    import datetime as dt

    from postbacks.transport.http import _retry_after

    now = dt.datetime(2026, 12, 6, 20, 30, tzinfo=dt.UTC).timestamp()
    assert _retry_after(value, now) == seconds
