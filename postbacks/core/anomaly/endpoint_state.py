"""An endpoint's rolling-detector state as the gate keeps it in its table, exactly once.

Every persisted value carries ``o``, the source offset of the last delivery counted in it;
a delivery read again after a crash (at or below ``o``) is decided again but not counted
again (see :mod:`.persist`). The state is three table keys, each written only when it
changes, all to the endpoint's changelog partition, in this order:

- ``profile``: the hour-of-week profile (up to about 30 KB), written when an hour closes;
- ``ring``: the rest of the rolling state (:func:`.rolling_codec.to_dict` without the
  profile: the last hour's closed minutes, today's level, the CUSUM arms), about 5 KB,
  written when a minute closes;
- ``open``: the open minute's and hour's running totals, a few numbers, written at every
  commit that touched the endpoint.

:func:`restore` joins the newest of each. ``open`` applies only to the minute ``ring``
was written for (a later minute's ``ring`` always comes with it); otherwise the ring's own
totals and offset stand, which can only under-count.

``pk``, the endpoint's payout peaks (:mod:`.outlier`), rides with them in ``ring`` and
``open``. ``halted`` and ``since`` carry a close across restarts and rebalances: once a tripped
endpoint is closed, its spans judge only minutes after the newest one known then (that
minute's money came before the close), so the incident still inside its 15- and
60-minute spans does not trip it again (as for the global scope: ``docs/detector.md``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from postbacks.core.anomaly.outlier import NO_PEAKS, Peaks, peaks_from, to_json
from postbacks.core.anomaly.persist import NOTHING, Value
from postbacks.core.anomaly.profile import SLOTS, format_profile
from postbacks.core.anomaly.rolling import RollingPolicy, RollingState, empty
from postbacks.core.anomaly.rolling_codec import from_dict, to_dict

__all__ = ["ENDPOINT_POLICY", "EndpointState", "dump", "restore"]

# One conversion counts for up to twice its slot's mean payout (rolling_types.cap): a
# burst of ordinary conversions on a sparse endpoint counts in full.
ENDPOINT_POLICY = RollingPolicy(conversion_cap=2.0)


@dataclasses.dataclass(frozen=True, slots=True)
class EndpointState:
    """The rolling state, the offset of the last delivery counted, and what is written."""

    state: RollingState
    offset: int = NOTHING
    written_hour: int | None = None  # the hour whose profile was written last
    written_minute: int | None = None  # the open minute the ring was written for
    halted: bool = False  # the endpoint's value-rate halt was tripped when last seen
    since: int | None = None  # after a close: spans judge only minutes from this one
    peaks: Peaks = NO_PEAKS  # the largest payouts of the last weeks (.outlier)


def dump(t: EndpointState) -> tuple[Value | None, Value | None, Value, EndpointState]:
    """``(profile or None, ring or None, open, state-after)``: each only when it moved."""
    s = t.state
    hour = None if s.minute is None else s.minute // 60
    profile = ring = None
    if hour != t.written_hour:
        profile = {"hour": hour, "profile": format_profile(s.profile), "o": t.offset}
    marks = {"halted": t.halted, "since": t.since, "pk": to_json(t.peaks)}
    if s.minute != t.written_minute:
        ring = {**to_dict(s, profile=False), "o": t.offset, **marks}
    open_ = {"m": s.minute, "c": s.cur, "n": s.ccur, "ht": s.h_total, "hn": s.h_count,
             "o": t.offset, **marks}
    return profile, ring, open_, dataclasses.replace(t, written_hour=hour,
                                                     written_minute=s.minute)


def _load(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"endpoint state: {what} is not an object")
    return value


def restore(profile: object | None, ring: object | None, open_: object | None,
            policy: RollingPolicy = ENDPOINT_POLICY) -> EndpointState:
    """The state the persisted values describe (empty when nothing was persisted).

    Raises ValueError on a malformed value: the caller logs it and starts the endpoint
    afresh, which can only under-count, never hold wrongly."""
    if ring is None:
        return EndpointState(empty(policy))
    r = _load(ring, "ring")
    offset = r.get("o")
    if type(offset) is not int:
        raise ValueError("endpoint state: the ring has no offset")
    text: object = ";" * (SLOTS - 1)  # no profile yet: every slot empty
    written_hour: object = None
    if profile is not None:
        p = _load(profile, "profile")
        text, written_hour = p.get("profile"), p.get("hour")
    if not isinstance(text, str) or not (written_hour is None or type(written_hour) is int):
        raise ValueError("endpoint state: a malformed profile")
    s = from_dict({k: v for k, v in r.items() if k not in _OURS}, text)
    halted, since, peaks = _marks(r)
    if open_ is not None:
        o = _load(open_, "open")
        cur, ccur, h_total, h_count, o_off = (o.get(k) for k in ("c", "n", "ht", "hn", "o"))
        if (o.get("m") == s.minute and type(cur) is int and type(ccur) is int
                and type(h_total) is int and type(h_count) is int and type(o_off) is int
                and o_off >= offset):
            s = dataclasses.replace(s, cur=cur, ccur=ccur, h_total=h_total, h_count=h_count)
            offset = o_off
            halted, since, peaks = _marks(o)
    return EndpointState(s, offset, written_hour, s.minute, halted, since, peaks)


_OURS = ("o", "halted", "since", "pk")


def _marks(v: dict[str, Any]) -> tuple[bool, int | None, Peaks]:
    halted, since = v.get("halted", False), v.get("since")
    if type(halted) is not bool or not (since is None or type(since) is int):
        raise ValueError("endpoint state: bad halted or since")
    try:
        peaks = peaks_from(v.get("pk"))
    except ValueError:  # only the peaks afresh: nothing judged until they are rebuilt
        peaks = NO_PEAKS
    return halted, since, peaks
