"""Hour-of-week profile of a scope's payout, and the per-minute expectation drawn from it.

The profile keeps, per UTC hour of the week (168 slots, Monday 00:00 is slot 0), the last
``weeks`` closed hours of that slot, oldest first, each as ``(total, count, sq, csq)``:

- ``total``: payout in the hour (micros), ``count``: payouts counted;
- ``sq`` and ``csq``: the sums over the hour's 60 minutes of (minute total)^2 and of
  (minute count)^2, so the spread of minutes inside the hour is known without keeping them.

Two *channels* are drawn from it, with the same arithmetic: ``VALUE`` (payout micros)
and ``COUNT`` (conversions).

From it, per slot (:class:`SlotStat`): the mean hourly total over the trailing weeks, the
variance of one minute's total, and the week-to-week excess variance of the hour. Pooled
over the whole profile (:class:`ProfileStats`):

- ``dispersion``: variance of a minute's total per unit of its mean. For value it is at
  least the mean payout (the compound-Poisson bound: n payouts of mean m have variance
  >= n m^2), for counts at least 1 (Poisson), so a smooth history still has a noise floor.
  Value pools it over the whole profile (a few large payouts dominate it, and they need
  every hour to be seen); counts take it per hour with its two neighbours (their
  over-dispersion grows with the rate, so a quiet hour is steadier than a busy one);
- ``cv2``: squared relative week-to-week variation of the level of an hour, beyond what
  minute noise explains (a Tuesday 14:00 that runs 3% above the last weeks' mean): the
  mean over slots of (variance of the hourly totals across weeks - 60 x minute variance)
  / mean^2, at least 0.

**Expected rate per minute** (:func:`expect_minute`): the slot's mean hourly total / 60
sits at the middle of the hour; a minute is interpolated linearly between the middles of
its hour and the neighbouring one, so the expectation has no step at an hour boundary
(14:59 and 15:00 expect nearly the same). A linear trend keeps every hour's total exactly.
A slot with fewer than ``min_weeks`` samples has no expectation (``None``): its minutes
cannot trip. Pure and immutable.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from postbacks.core.anomaly.windows import HOUR_MS, week_slot

__all__ = [
    "COUNT",
    "MINUTE_MS",
    "SLOTS",
    "VALUE",
    "HourEntry",
    "Profile",
    "ProfileStats",
    "SlotStat",
    "close_hour",
    "count_stats",
    "expect_minute",
    "format_profile",
    "parse_profile",
    "slot_of_hour",
    "stats",
    "with_slot",
]

MINUTE_MS = 60_000
SLOTS = 168

# (total micros, count, sum of squared minute totals, sum of squared minute counts)
HourEntry = tuple[int, int, float, int]
Profile = tuple[tuple[HourEntry, ...], ...]  # per slot, oldest -> newest


class SlotStat(NamedTuple):
    mean: float | None  # mean hourly total (None below min_weeks samples)
    minute_var: float  # mean over weeks of the variance of a minute's total
    week_var: float | None  # sample variance of the hourly totals across weeks (n >= 2)
    var_num: float  # pooled: sum over weeks of the minute variance
    var_den: float  # pooled: sum over weeks of the mean minute total
    floor_num: int  # pooled: the dispersion's lower bound is floor_num / floor_den
    floor_den: int


class ProfileStats(NamedTuple):
    slots: tuple[SlotStat, ...]
    dispersion: float  # variance of a minute total per unit of its mean (pooled)
    cv2: float  # squared relative level variation of an hour, week to week (>= 0)
    floor: float = 0.0  # the dispersion's lower bound (mean payout; 1 for counts)
    local: bool = False  # dispersion per hour and its neighbours, not pooled (counts)


VALUE = 0  # channel: payout micros (total, sq); dispersion >= mean payout
COUNT = 1  # channel: conversions (count, csq); dispersion >= 1 (Poisson)


def slot_of_hour(hour_index: int) -> int:
    """Week slot of the hour ``hour_index`` (hours since the epoch)."""
    return week_slot(hour_index * HOUR_MS)


def _slot_stat(entries: tuple[HourEntry, ...], min_weeks: int, channel: int) -> SlotStat:
    n = len(entries)
    if n == 0:
        return SlotStat(None, 0.0, None, 0.0, 0.0, 0, 0)
    num = 0.0
    den = 0.0
    tot = cnt = 0
    xs = []
    for t, c, sq, csq in entries:
        x, xsq = (t, sq) if channel == VALUE else (c, float(csq))
        xs.append(x)
        mu = x / 60
        num += max(0.0, (xsq - 60 * mu * mu) / 59)
        den += mu
        tot += t if channel == VALUE else c
        cnt += c
    mean = sum(xs) / n
    week_var = sum((x - mean) ** 2 for x in xs) / (n - 1) if n >= 2 else None
    return SlotStat(mean if n >= min_weeks else None, num / n, week_var, num, den, tot, cnt)


def _pooled(slots: tuple[SlotStat, ...], local: bool) -> ProfileStats:
    """Pooled statistics: a function of the slots alone (so a restored state agrees)."""
    num = den = 0.0
    tot = cnt = 0
    for s in slots:
        num += s.var_num
        den += s.var_den
        tot += s.floor_num
        cnt += s.floor_den
    floor = tot / cnt if cnt else 0.0
    dispersion = max(num / den if den > 0 else 0.0, floor)
    rel_sum = 0.0
    rel_n = 0
    for s in slots:
        if s.week_var is not None and s.mean is not None and s.mean > 0:
            noise = 60 * max(s.minute_var, (floor if local else dispersion) * s.mean / 60)
            rel_sum += (s.week_var - noise) / (s.mean * s.mean)
            rel_n += 1
    cv2 = max(0.0, rel_sum / rel_n) if rel_n else 0.0
    return ProfileStats(slots, dispersion, cv2, floor, local)


def stats(profile: Profile, min_weeks: int, channel: int = VALUE) -> ProfileStats:
    """Every slot's statistics and the pooled ones, for one channel."""
    return _pooled(tuple(_slot_stat(e, min_weeks, channel) for e in profile), channel == COUNT)


def count_stats(profile: Profile, min_weeks: int) -> ProfileStats:
    """:func:`stats` of the ``COUNT`` channel."""
    return stats(profile, min_weeks, COUNT)


def with_slot(st: ProfileStats, profile: Profile, slot: int, min_weeks: int,
              channel: int = VALUE) -> ProfileStats:
    """``st`` after ``profile[slot]`` changed (the other slots' statistics stand)."""
    one = _slot_stat(profile[slot], min_weeks, channel)
    return _pooled((*st.slots[:slot], one, *st.slots[slot + 1:]), st.local)


def close_hour(profile: Profile, slot: int, entry: HourEntry, weeks: int) -> Profile:
    """``profile`` with ``entry`` appended to ``slot`` (keeping the last ``weeks``)."""
    return (*profile[:slot], (*profile[slot], entry)[-weeks:], *profile[slot + 1:])


def _slot_rate(st: ProfileStats, slot: int) -> tuple[float, float] | None:
    s = st.slots[slot]
    if s.mean is None:
        return None
    rate = s.mean / 60
    if st.local:  # this hour and its neighbours: count noise grows faster than the rate
        near = (st.slots[(slot - 1) % SLOTS], s, st.slots[(slot + 1) % SLOTS])
        den = sum(x.var_den for x in near)
        d = sum(x.var_num for x in near) / den if den > 0 else 0.0
        return rate, max(d, st.floor) * rate
    return rate, max(s.minute_var, st.dispersion * rate)


def expect_minute(st: ProfileStats, minute_index: int) -> tuple[float, float] | None:
    """(expected total, variance of the total) of minute ``minute_index``; None if unknown.

    The minute's centre is ``u + 0.5`` minutes into its hour; the hour's rate sits at 30.
    Before the middle the previous hour's rate is blended in, after it the next one's, with
    weight ``distance / 60``. A neighbour without a mean leaves the slot's own rate.
    """
    hour, u = divmod(minute_index, 60)
    slot = slot_of_hour(hour)
    own = _slot_rate(st, slot)
    if own is None:
        return None
    x = u + 0.5 - 30
    other = _slot_rate(st, (slot + (1 if x > 0 else -1)) % SLOTS)
    if other is None:
        return own
    w = abs(x) / 60
    return own[0] * (1 - w) + other[0] * w, own[1] * (1 - w) + other[1] * w


def format_profile(profile: Profile) -> str:
    """Slots joined by ``;``, a slot's hours by ``,``, an hour's fields by ``:``."""
    return ";".join(",".join(f"{t}:{c}:{sq!r}:{csq}" for t, c, sq, csq in s)
                    for s in profile)


def parse_profile(raw: str, weeks: int) -> Profile:
    """Inverse of :func:`format_profile` (trimmed to ``weeks``); ValueError if malformed."""
    slots = raw.split(";")
    if len(slots) != SLOTS:
        raise ValueError(f"profile: {len(slots)} slots, expected {SLOTS}")
    out = []
    for s in slots:
        entries = []
        for item in filter(None, s.split(",")):
            t, c, sq, csq = item.split(":")
            e = (int(t), int(c), float(sq), int(csq))
            if e[1] < 0 or not math.isfinite(e[2]) or e[2] < 0 or e[3] < 0:
                raise ValueError(f"profile: bad hour {item!r}")
            entries.append(e)
        out.append(tuple(entries)[-weeks:])
    return tuple(out)
