"""A rolling detector's state as a table-changelog value (``to_dict``) and back.

Ints, floats and strings only, about 34 KB per scope with a full four-week profile (the
profile may be kept apart: ``to_dict(s, profile=False)``, ``from_dict(d, profile=text)``): the
minute rings as comma-joined numbers, the profile as :func:`format_profile` writes it, the
CUSUM arms as ``;``-joined groups (a state written before the arms existed restores them at
zero, with the default shifts and allowance). The
capped values are derived again on the way back (they depend only on the stored minutes
and the policy); the profile statistics too. So ``to_dict(from_dict(d)) == d``, and a
restored state decides exactly as the one that was saved.
"""

from __future__ import annotations

import math

from postbacks.core.anomaly.cusum import Arm
from postbacks.core.anomaly.level import format_level, parse_level
from postbacks.core.anomaly.profile import count_stats, format_profile, parse_profile, stats
from postbacks.core.anomaly.rolling import RollingPolicy, RollingState

__all__ = ["Stored", "from_dict", "to_dict"]

_FORMAT = 1
Stored = dict[str, int | float | str]


def _join(values: tuple[float, ...] | tuple[int, ...]) -> str:
    return ",".join(map(repr, values))


def to_dict(s: RollingState, *, profile: bool = True) -> Stored:
    """Compact form for a table changelog; ``profile=False`` leaves out the profile (the
    bulk of it, which changes once an hour: see :mod:`.endpoint_state`)."""
    p = s.policy
    out: Stored = {
        "v": _FORMAT, "spans": ",".join(map(str, p.spans)), "weeks": p.weeks,
        "min_weeks": p.min_weeks, "clip": p.clip_sigmas, "cur": s.cur, "ccur": s.ccur,
        "obs": _join(s.obs), "exp": _join(s.exp), "var": _join(s.var),
        "cobs": _join(s.cobs), "cexp": _join(s.cexp), "cvar": _join(s.cvar),
        "h_total": s.h_total, "h_count": s.h_count, "h_sq": s.h_sq, "h_csq": s.h_csq,
        "lv": format_level(s.lv), "lc": format_level(s.lc),
        "shifts": _join(p.shifts), "allowance": p.allowance, "arms_from": s.arms_from,
        "arms": ";".join(_join((a.s, a.start, a.obs, a.exp, a.var, a.cobs, a.cexp))
                         for a in s.arms),
    }
    if p.conversion_cap:
        out["ccap"] = p.conversion_cap
    if profile:
        out["profile"] = format_profile(s.profile)
    if s.minute is not None:
        out["minute"] = s.minute
    return out


def _int(data: Stored, key: str) -> int:
    value = data.get(key)
    if type(value) is not int:
        raise ValueError(f"rolling state: {key!r} must be an int, got {value!r}")
    return value


def _float(data: Stored, key: str) -> float:
    value = data.get(key)
    if type(value) is int:
        return float(value)
    if type(value) is not float:
        raise ValueError(f"rolling state: {key!r} must be a number, got {value!r}")
    return value


def _str(data: Stored, key: str) -> str:
    value = data.get(key)
    if type(value) is not str:
        raise ValueError(f"rolling state: {key!r} must be a string, got {value!r}")
    return value


def _ints(data: Stored, key: str) -> tuple[int, ...]:
    return tuple(int(x) for x in _str(data, key).split(",") if x)


def _floats(data: Stored, key: str) -> tuple[float, ...]:
    return tuple(float(x) for x in _str(data, key).split(",") if x)


def _arms(raw: str, n: int) -> tuple[Arm, ...]:
    """The CUSUM arms (none: all at zero)."""
    if not raw:
        return ()
    arms = []
    for part in raw.split(";"):
        xs = [float(x) for x in part.split(",")]
        if len(xs) != 7 or not all(math.isfinite(x) for x in xs):
            raise ValueError(f"rolling state: bad arm {part!r}")
        arms.append(Arm(xs[0], int(xs[1]), *xs[2:]))
    if len(arms) != n:
        raise ValueError(f"rolling state: {len(arms)} arms, expected {n}")
    return tuple(arms)


def from_dict(data: Stored, profile: str | None = None) -> RollingState:
    """Inverse of :func:`to_dict`; raises ValueError on anything malformed. ``profile``:
    the profile's text for a ``data`` written without it."""
    if data.get("v") != _FORMAT:
        raise ValueError(f"rolling state: unknown format {data.get('v')!r}")
    try:
        # a state written before the CUSUM arms existed: the default arms, at zero
        shifts = (tuple(float(x) for x in _str(data, "shifts").split(",")) if "shifts" in data
                  else RollingPolicy().shifts)
        allowance = (_float(data, "allowance") if "allowance" in data
                     else RollingPolicy().allowance)
        p = RollingPolicy(tuple(int(x) for x in _str(data, "spans").split(",")),
                          _int(data, "weeks"), _int(data, "min_weeks"), _float(data, "clip"),
                          shifts, allowance,
                          _float(data, "ccap") if "ccap" in data else 0.0)
        arms = _arms(_str(data, "arms"), len(shifts)) if "arms" in data else ()
        arms_from = _int(data, "arms_from") if "arms_from" in data else 0
        rings = (_ints(data, "obs"), _floats(data, "exp"), _floats(data, "var"),
                 _ints(data, "cobs"), _floats(data, "cexp"), _floats(data, "cvar"))
        prof = parse_profile(_str(data, "profile") if profile is None else profile, p.weeks)
        lv, lc = parse_level(_str(data, "lv")), parse_level(_str(data, "lc"))
    except ValueError as e:
        msg = str(e)
        raise ValueError(msg if msg.startswith("rolling state") else
                         f"rolling state: {msg}") from None
    obs, exp, var, cobs, cexp, cvar = rings
    if len({len(r) for r in rings}) != 1 or len(obs) > p.ring:
        raise ValueError("rolling state: minute rings of different lengths")
    minute = data.get("minute")
    if minute is not None and type(minute) is not int:
        raise ValueError("rolling state: 'minute' must be an int")
    capped = tuple(float(o) if math.isnan(e) else min(float(o), p.cap(e, v, c, ce))
                   for o, e, v, c, ce in zip(obs, exp, var, cobs, cexp, strict=True))
    return RollingState(p, minute, _int(data, "cur"), _int(data, "ccur"), obs, capped, exp,
                        var, cobs, cexp, cvar, _int(data, "h_total"), _int(data, "h_count"),
                        _float(data, "h_sq"), _int(data, "h_csq"), prof,
                        stats(prof, p.min_weeks), count_stats(prof, p.min_weeks), lv, lc,
                        arms, arms_from)
