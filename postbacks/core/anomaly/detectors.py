"""The two detectors of seed §5.11, as pure checks returning typed, ``match``-able results.

**Retrodating guard** (per delivery): retrodated when
``source_created_at - source_completed_at`` *exceeds* the window (default 7 days; exactly
the window is not retrodated). Completion after creation (a negative age) is not
retrodated. A timestamp is epoch milliseconds or ISO-8601 with an offset
(:func:`postbacks.core.instants.parse_instant`); a missing one, or one that is neither (or
outside 1970..9999), is :class:`MissingInputs` naming the field — never a pass: the
caller's mode decides (detect: metric and deliver; enforce: hold).

**Payout value rate** (per scope): the rolling detector (:mod:`.rolling`) returns
:class:`RollingOver` or :class:`RollingWithin`; :func:`.rolling.as_rate_result` turns them
into the :data:`RateResult` that :func:`.modes.decide` takes: :class:`Over` (the scope is
over its thresholds), :class:`Within`, or :class:`NoBaseline` (no expectation yet: it
cannot trip).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from postbacks.core.anomaly.windows import DAY_MS
from postbacks.core.instants import (
    MAX_FUTURE_MS,
    MAX_MS,
    MIN_OCCURRED_AT_MS,
    InstantError,
    parse_instant,
)

__all__ = [
    "MAX_AHEAD_MS",
    "MAX_PAYOUT_MICROS",
    "MISSING_PAYOUT",
    "NO_BASELINE",
    "RETRODATING_WINDOW_MS",
    "WITHIN",
    "MissingInputs",
    "NoBaseline",
    "Over",
    "RateResult",
    "Within",
    "as_ms",
    "event_time_input",
    "instant_input",
    "payout_input",
    "retrodated",
]

RETRODATING_WINDOW_MS = 7 * DAY_MS
# How far ahead of its clock the gate counts a payout: the fan-out's bound, plus slack for
# a gate whose clock is behind the fan-out's (it would hold what the fan-out accepted).
MAX_AHEAD_MS = MAX_FUTURE_MS + 10 * 60_000
MAX_PAYOUT_MICROS = 10**12  # USD 1,000,000 for one conversion: more is not a payout


@dataclass(frozen=True, slots=True)
class MissingInputs:
    """Required inputs that were absent or unparseable, by record field name."""

    fields: tuple[str, ...]
    unparseable: tuple[str, ...] = ()  # those of ``fields`` present but not usable

    def describe(self) -> str:
        """The fields, for a hold's reason: ``source_completed_at (unparseable), ...``."""
        return ", ".join(f"{f} (unparseable)" if f in self.unparseable else f"{f} (missing)"
                         for f in self.fields)


_NO_CREATED = MissingInputs(("source_created_at",))
_NO_COMPLETED = MissingInputs(("source_completed_at",))
_NO_TIMESTAMPS = MissingInputs(("source_created_at", "source_completed_at"))
MISSING_PAYOUT = MissingInputs(("payout_usd_micros",))


def as_ms(value: object) -> int | None:
    """An integer from an int, an integral float or an integer string; else None."""
    if type(value) is int:
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else None
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def instant_input(value: object, field: str) -> int | InstantError | None:
    """An input timestamp as epoch ms; None when absent; the InstantError when present but
    neither epoch ms (an int, an integral float, a digit string) nor ISO-8601 with an
    offset, or outside 2000..9999 (before 2000: epoch seconds, which would never compare
    as retrodated)."""
    if value is None:
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    try:
        ms = parse_instant(value, field)
    except InstantError as exc:
        return exc
    if ms < MIN_OCCURRED_AT_MS:  # a source time in epoch seconds is never "retrodated"
        return InstantError(field, value, "before 2000: epoch seconds where milliseconds "
                            "belong?")
    return ms


_C, _D = "source_created_at", "source_completed_at"


def retrodated(created_ms: object, completed_ms: object,
               window_ms: int = RETRODATING_WINDOW_MS) -> bool | MissingInputs:
    """Is ``created - completed`` more than ``window_ms``? MissingInputs if undecidable."""
    if (type(created_ms) is int and type(completed_ms) is int  # the hot path
            and MIN_OCCURRED_AT_MS <= created_ms <= MAX_MS
            and MIN_OCCURRED_AT_MS <= completed_ms <= MAX_MS):
        return created_ms - completed_ms > window_ms
    created, completed = instant_input(created_ms, _C), instant_input(completed_ms, _D)
    if type(created) is int and type(completed) is int:
        return created - completed > window_ms
    if created is None and completed is None:
        return _NO_TIMESTAMPS
    if created is None and type(completed) is int:
        return _NO_CREATED
    if completed is None and type(created) is int:
        return _NO_COMPLETED
    fields = tuple(f for f, v in ((_C, created), (_D, completed)) if type(v) is not int)
    bad = tuple(f for f, v in ((_C, created), (_D, completed)) if isinstance(v, InstantError))
    return MissingInputs(fields, bad)


_BAD_PAYOUT = MissingInputs(("payout_usd_micros",), ("payout_usd_micros",))


def payout_input(value: object) -> int | MissingInputs:
    """The payout in micros, or MissingInputs when absent, unparseable, negative or over
    :data:`MAX_PAYOUT_MICROS` (summed per minute, such payouts overflowed a long)."""
    if value is None:
        return MISSING_PAYOUT
    micros = value if type(value) is int else as_ms(value)
    return (_BAD_PAYOUT if micros is None or micros < 0 or micros > MAX_PAYOUT_MICROS
            else micros)


_OCCURRED = "occurred_at"
_BAD_OCCURRED = MissingInputs((_OCCURRED,), (_OCCURRED,))


def event_time_input(micros: int | MissingInputs, occurred_at: int,
                     now_ms: int) -> int | MissingInputs:
    """``micros`` (from :func:`payout_input`), or MissingInputs naming ``occurred_at`` too
    when the payout's event time is before 2000 or more than :data:`MAX_AHEAD_MS` ahead of
    ``now_ms``: a payout that cannot be placed in time is not counted in any window."""
    if MIN_OCCURRED_AT_MS <= occurred_at <= now_ms + MAX_AHEAD_MS:
        return micros
    if type(micros) is int:
        return _BAD_OCCURRED
    assert isinstance(micros, MissingInputs)
    return MissingInputs((*micros.fields, _OCCURRED), (*micros.unparseable, _OCCURRED))


@dataclass(frozen=True, slots=True)
class Over:
    """The scope's open window is over its thresholds."""

    window_start_ms: int
    observed_micros: int
    baseline_micros: float


@dataclass(frozen=True, slots=True)
class Within:
    """Evaluated: not over the thresholds."""


@dataclass(frozen=True, slots=True)
class NoBaseline:
    """Not enough history for this window's slot: the rate cannot trip."""


WITHIN = Within()
NO_BASELINE = NoBaseline()
RateResult = Over | Within | NoBaseline
