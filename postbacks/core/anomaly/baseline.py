"""Seasonal payout baseline for one scope (an endpoint, or the global roll-up).

State: per week slot (see :mod:`.windows`; one slot per (day-of-week, hour-of-day) with
one-hour windows) the totals of the last ``weeks`` *closed* windows in that slot, oldest
first, plus the running total of the one open window. Values are immutable; every
function returns a new state.

Policy:

- **Event time.** An event counts in the window of its ``occurred_at``. An event for a
  later window closes the open window (and every window in between) first. A *late* event
  (its window already closed) counts in the open window: late money still counts now,
  it is never dropped from the rate.
- **Empty windows count as 0.** Closing is contiguous from the scope's first window, so a
  quiet hour has a quiet history and a burst in it stands out (the absolute floor of the
  detector keeps a near-zero baseline from tripping on noise).
- **Baseline = median** of the slot's trailing closed totals (robust to one bad week
  already in the history). With fewer than ``min_weeks`` samples there is **no baseline**
  (``None``) and the value-rate detector cannot trip for that window: a scope younger
  than ``min_weeks`` weeks is covered only by the retrodating guard and by the global
  scope, never by a guess.
- History starts at the scope's first event: nothing is invented before it.
"""

from __future__ import annotations

from dataclasses import dataclass

from postbacks.core.anomaly.windows import (
    DEFAULT_WINDOW_MS,
    check_window_ms,
    slots_per_week,
    week_slot,
)

__all__ = [
    "BaselinePolicy",
    "SeasonalBaseline",
    "add",
    "baseline",
    "close_until",
    "empty",
    "from_dict",
    "median",
    "to_dict",
]

_FORMAT = 1


@dataclass(frozen=True, slots=True)
class BaselinePolicy:
    """Window size, trailing weeks kept per slot, and samples needed for a baseline."""

    window_ms: int = DEFAULT_WINDOW_MS
    weeks: int = 4
    min_weeks: int = 2

    def __post_init__(self) -> None:
        check_window_ms(self.window_ms)
        if not 1 <= self.min_weeks <= self.weeks:
            raise ValueError(f"need 1 <= min_weeks <= weeks: {self.min_weeks}, {self.weeks}")


DEFAULT_POLICY = BaselinePolicy()


@dataclass(frozen=True, slots=True)
class SeasonalBaseline:
    """One scope's baseline state; ``open_baseline`` caches ``baseline(open_start)``."""

    policy: BaselinePolicy
    history: tuple[tuple[int, ...], ...]  # per week slot, oldest -> newest, <= weeks
    open_start: int | None  # None until the first event
    open_total: int
    open_baseline: float | None


def median(samples: tuple[int, ...]) -> float:
    """Median of a non-empty sample (mean of the middle two for an even count)."""
    s = sorted(samples)
    mid = len(s) // 2
    return float(s[mid]) if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def _stat(samples: tuple[int, ...], min_weeks: int) -> float | None:
    return median(samples) if len(samples) >= min_weeks else None


def empty(policy: BaselinePolicy = DEFAULT_POLICY) -> SeasonalBaseline:
    """A scope that has seen nothing yet."""
    return SeasonalBaseline(policy, ((),) * slots_per_week(policy.window_ms), None, 0, None)


def baseline(state: SeasonalBaseline, window_start_ms: int) -> float | None:
    """Median closed total of the window's week slot, or None below ``min_weeks`` samples."""
    p = state.policy
    return _stat(state.history[week_slot(window_start_ms, p.window_ms)], p.min_weeks)


def _roll(state: SeasonalBaseline, new_start: int) -> SeasonalBaseline:
    """Close the open window and every window before ``new_start``; open ``new_start``."""
    p = state.policy
    open_start = state.open_start
    if open_start is None:
        raise ValueError("no open window to close")
    n_slots = len(state.history)
    n = (new_start - open_start) // p.window_ms
    if n > p.weeks * n_slots:  # a gap longer than the history: every sample is a zero
        history: tuple[tuple[int, ...], ...] = ((0,) * p.weeks,) * n_slots
    else:
        hist = list(state.history)
        slot = week_slot(open_start, p.window_ms)
        total = state.open_total
        for _ in range(n):
            hist[slot] = (*hist[slot], total)[-p.weeks:]
            total = 0
            slot = (slot + 1) % n_slots
        history = tuple(hist)
    new_slot = week_slot(new_start, p.window_ms)
    return SeasonalBaseline(p, history, new_start, 0, _stat(history[new_slot], p.min_weeks))


def add(state: SeasonalBaseline, occurred_at_ms: int, payout_micros: int) -> SeasonalBaseline:
    """Count one payout at its event time (closing windows it has moved past)."""
    start = occurred_at_ms - occurred_at_ms % state.policy.window_ms
    open_start = state.open_start
    if open_start is not None and start <= open_start:  # the open window, or late
        return SeasonalBaseline(state.policy, state.history, open_start,
                                state.open_total + payout_micros, state.open_baseline)
    if open_start is None:
        p = state.policy
        b = _stat(state.history[week_slot(start, p.window_ms)], p.min_weeks)
        return SeasonalBaseline(p, state.history, start, payout_micros, b)
    rolled = _roll(state, start)
    return SeasonalBaseline(rolled.policy, rolled.history, start, payout_micros,
                            rolled.open_baseline)


def close_until(state: SeasonalBaseline, now_ms: int) -> SeasonalBaseline:
    """Close every window whose end is <= ``now_ms``; the window holding ``now`` opens.

    ``now`` is whatever clock the caller closes on (the event-time watermark in replay).
    A scope that has seen no event is left as it is.
    """
    if state.open_start is None:
        return state
    start = now_ms - now_ms % state.policy.window_ms
    return state if start <= state.open_start else _roll(state, start)


def to_dict(state: SeasonalBaseline) -> dict[str, int | str]:
    """Compact form for a table changelog: ints and strings only.

    ``history`` is one string: slots separated by ``;``, a slot's totals by ``,``.
    """
    p = state.policy
    out: dict[str, int | str] = {
        "v": _FORMAT, "window_ms": p.window_ms, "weeks": p.weeks, "min_weeks": p.min_weeks,
        "open_total": state.open_total,
        "history": ";".join(",".join(map(str, s)) for s in state.history),
    }
    if state.open_start is not None:
        out["open_start"] = state.open_start
    return out


def _int(data: dict[str, int | str], key: str) -> int:
    value = data.get(key)
    if type(value) is not int:
        raise ValueError(f"baseline state: {key!r} must be an int, got {value!r}")
    return value


def from_dict(data: dict[str, int | str],
              policy: BaselinePolicy | None = None) -> SeasonalBaseline:
    """Inverse of :func:`to_dict`; raises ValueError on anything malformed.

    With ``policy`` (the current configuration) the stored history is re-trimmed to its
    ``weeks``; a different window size is refused (the slots would not line up).
    """
    if data.get("v") != _FORMAT:
        raise ValueError(f"baseline state: unknown format {data.get('v')!r}")
    stored = BaselinePolicy(_int(data, "window_ms"), _int(data, "weeks"),
                            _int(data, "min_weeks"))
    p = policy or stored
    if p.window_ms != stored.window_ms:
        raise ValueError("baseline state: stored window size differs from the policy's")
    raw = data.get("history")
    if not isinstance(raw, str):
        raise ValueError("baseline state: 'history' must be a string")
    try:
        history = tuple(tuple(int(x) for x in s.split(",") if x)[-p.weeks:]
                        for s in raw.split(";"))
    except ValueError as e:
        raise ValueError(f"baseline state: bad history: {e}") from None
    if len(history) != slots_per_week(p.window_ms):
        raise ValueError("baseline state: wrong number of week slots")
    open_start = _int(data, "open_start") if "open_start" in data else None
    b = None if open_start is None else _stat(
        history[week_slot(open_start, p.window_ms)], p.min_weeks)
    return SeasonalBaseline(p, history, open_start, _int(data, "open_total"), b)
