"""The global aggregator: per-minute partials of every partition -> the rolling detector."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from prometheus_client import REGISTRY

from postbacks.codec import codec_for
from postbacks.core.anomaly import GLOBAL_SCOPE, Detector, HaltState, Trip
from postbacks.core.anomaly.rolling import GLOBAL_ROLLING, RollingOver, RollingWithin
from postbacks.core.anomaly.rolling_codec import to_dict
from postbacks.db.anomaly import AnomalyRow
from streams.anomaly_gate import aggregate
from streams.anomaly_gate.aggregate import (
    GLOBAL_ROLL,
    SCORED_OPEN_MINUTES,
    UNHEARD_GRACE_MS,
    GlobalAggregator,
)
from streams.anomaly_gate.config import HaltBook, StateChange, build_config

GKEY = "unit-global"
MIN = 60_000
WEEK_MIN = 7 * 24 * 60
T0 = 1_700_000_000_000 - 1_700_000_000_000 % (7 * 86_400_000)  # a week boundary (Thursday)
NOW = 1_800_000_000_000
USD = 1_000_000
PARTIAL = codec_for("PayoutPartial")
_SOURCE = itertools.count(1)


def row(mode: str, params: dict[str, Any] | None = None) -> AnomalyRow:
    return AnomalyRow("global", GKEY, "value_rate", mode, params or {}, "closed", None, None)


def partial(partition: int, window: int, total: int, count: int = 1,
            source_offset: int | None = None, sent: int = NOW) -> bytes:
    src = next(_SOURCE) if source_offset is None else source_offset
    return PARTIAL.encode({"partition": partition, "window_start": window, "total_micros": total,
                           "count": count, "source_offset": src, "produced_at": sent})


class Agg:
    def __init__(self, *rows: AnomalyRow, store: dict[str, Any] | None = None,
                 partitions: int = 1) -> None:
        cfg, _ = build_config(rows, GKEY)
        self.agg = GlobalAggregator(cfg, HaltBook(), GKEY, partitions=partitions)
        self.store: dict[str, Any] = {} if store is None else store
        self.offset = 0

    def feed(self, *partials: bytes, offsets: list[int] | None = None,
             now: int = NOW) -> list[Trip]:
        offsets = offsets or list(range(self.offset, self.offset + len(partials)))
        self.offset = max(self.offset, *(o + 1 for o in offsets))
        trips = self.agg.process(list(zip(offsets, partials, strict=True)),
                                 self.store.get, now)
        for k, v in self.agg.take_writes():
            self.store[k] = json.loads(json.dumps(v))
        return trips

    @property
    def total(self) -> tuple[int, int]:
        """The newest open minute's payout and count."""
        w = self.agg.windows
        return w[max(w)][:2] if w else (0, 0)


def _history(a: Agg, weeks: int = 2, per_min: int = 10) -> int:
    """``weeks`` of a flat 1 USD x ``per_min`` conversions a minute; returns the next minute."""
    n = weeks * WEEK_MIN
    a.feed(*(partial(0, T0 + m * MIN, per_min * USD, per_min) for m in range(n)))
    return T0 + n * MIN


def test_partials_of_three_partitions_sum_value_and_count() -> None:
    a = Agg()
    a.feed(partial(0, T0, 5 * USD, 2), partial(1, T0, 7 * USD, 3), partial(2, T0, 11 * USD, 1))
    assert a.total == (23 * USD, 6)
    a.feed(partial(1, T0, 9 * USD, 4))  # cumulative: only the increase counts
    assert a.total == (25 * USD, 7)


def test_resent_reread_and_stale_partials_change_nothing() -> None:
    a = Agg()
    a.feed(partial(0, T0, 5 * USD, 1, 10), partial(1, T0, 7 * USD, 1, 4))
    a.feed(partial(0, T0, 5 * USD, 1, 10))  # re-sent, identical
    a.feed(partial(0, T0, 4 * USD, 1, 8))  # re-computed after a restart (lower source offset)
    assert a.total == (12 * USD, 2)
    a.feed(partial(0, T0, 50 * USD), offsets=[1])  # topic offset already counted
    assert a.total == (12 * USD, 2)
    restarted = Agg(store=a.store)  # a new process reads the same partials again
    restarted.feed(partial(0, T0, 5 * USD, 1, 10), partial(1, T0, 7 * USD, 1, 4),
                   offsets=[0, 1])
    assert restarted.total == (12 * USD, 2)


def test_lagging_partition_holds_its_minute_open() -> None:
    a = Agg()
    a.feed(partial(0, T0, 100 * USD))
    a.feed(partial(1, T0 + 3 * MIN, 50 * USD))  # partition 1 is 3 minutes ahead
    a.feed(partial(0, T0, 110 * USD, 2))  # partition 0's minute grew (a late event)
    assert a.agg.window_total(T0) == 110 * USD
    assert a.agg.window_total(T0 + 3 * MIN) == 50 * USD
    assert a.agg.state.minute is None  # nothing closed: partition 0 is the watermark


def test_normal_history_is_within_and_a_surge_trips_once_under_enforce() -> None:
    a = Agg(row("enforce"))
    w = _history(a)
    assert not isinstance(a.agg.last, RollingOver)
    # an hour more: every span's minutes have an expectation (fixed when each closed)
    assert a.feed(*(partial(0, w + m * MIN, 10 * USD, 10) for m in range(61))) == []
    w += 60 * MIN
    assert isinstance(a.agg.last, RollingWithin)
    trips: list[Trip] = []
    for m in range(1, 6):  # +200 % a minute
        trips += a.feed(partial(0, w + m * MIN, 30 * USD, 30))
    assert len(trips) == 1
    t = trips[0]
    assert (t.scope, t.key, t.detector) == ("global", "*", Detector.VALUE_RATE)
    assert w - 5 * MIN < t.window_start_ms <= w + 5 * MIN  # a span ending in the surge
    assert t.detail is not None and "-min span" in t.detail and "score" in t.detail
    assert isinstance(a.agg.last, RollingOver)
    assert a.agg.halts.halts == {GLOBAL_SCOPE: HaltState.TRIPPED}
    assert a.feed(partial(0, w + 6 * MIN, 30 * USD, 30)) == []  # already halted


def test_over_under_detect_signals_and_does_not_trip() -> None:
    a = Agg(row("detect"))
    w = _history(a)
    a.feed(*(partial(0, w + m * MIN, 10 * USD, 10) for m in range(61)))
    w += 60 * MIN

    def signals() -> float:
        return REGISTRY.get_sample_value(
            "postbacks_anomaly_signals_total",
            {"reason": "payout_rate_global", "mode": "detect"}) or 0.0

    before = signals()
    for m in range(6):
        assert a.feed(partial(0, w + m * MIN, 40 * USD, 40)) == []
    assert a.agg.halts.halts == {}
    assert signals() > before


def test_the_rows_multiple_and_floor_set_the_rolling_thresholds() -> None:
    cfg, _ = build_config([row("enforce", {"multiple": 1.5, "floor_micros": 7 * USD})], GKEY)
    assert (cfg.global_rolling.multiple, cfg.global_rolling.floor_micros) == (1.5, 7 * USD)
    assert cfg.global_rolling.k == GLOBAL_ROLLING.k
    cfg, _ = build_config([row("enforce", {"multiple": "x"})], GKEY)
    assert cfg.global_rolling == GLOBAL_ROLLING


def test_the_rows_h_sets_the_cusum_arms_threshold() -> None:
    cfg, _ = build_config([row("enforce", {"k": 5.5, "h": 14.5})], GKEY)
    assert (cfg.global_rolling.k, cfg.global_rolling.cusum_h) == (5.5, 14.5)
    cfg, _ = build_config([row("enforce", {"h": "high"})], GKEY)
    assert cfg.global_rolling == GLOBAL_ROLLING


def test_a_restart_from_the_table_decides_exactly_as_an_uninterrupted_run() -> None:
    a, b = Agg(row("enforce")), Agg(row("enforce"))
    w = _history(a, weeks=1)
    _history(b, weeks=1)
    restarted = Agg(row("enforce"), store=b.store)
    restarted.offset = b.offset
    for m in range(30):
        p = partial(0, w + m * MIN, (10 + m) * USD, 10 + m, source_offset=10**6 + m)
        a.feed(p)
        restarted.feed(p)
    assert to_dict(restarted.agg.state) == to_dict(a.agg.state)  # (NaN != NaN in ==)
    assert restarted.agg.windows == a.agg.windows
    assert GLOBAL_ROLL in restarted.store


def test_partitions_far_apart_in_event_time_do_not_trip() -> None:
    """A backlog is read in chunks of hours per partition: a lagging partition's money is
    its own minute's, not a spike in the leader's."""
    a = Agg(row("enforce"), partitions=2)
    tripped: list[Trip] = []
    batch: list[bytes] = []
    for m in range(2 * WEEK_MIN + 600):
        batch.append(partial(0, T0 + m * MIN, 5 * USD, 5))
        if m >= 300:  # partition 1 runs five hours behind
            batch.append(partial(1, T0 + (m - 300) * MIN, 5 * USD, 5))
        if m % 60 == 59 or m >= 2 * WEEK_MIN:  # hourly batches, then one per minute
            tripped += a.feed(*batch)  # 300 minutes open
            batch = []
    assert tripped == []
    assert isinstance(a.agg.last, RollingWithin)


def test_unheard_partitions_hold_minutes_open_for_a_grace_that_survives_a_restart() -> None:
    a = Agg(partitions=2)
    a.feed(*(partial(0, T0 + m * MIN, USD) for m in range(6)))
    assert sorted(a.agg.windows) == [T0 + m * MIN for m in range(6)]  # partition 1 unheard
    restarted = Agg(store=a.store, partitions=2)
    restarted.feed(partial(0, T0 + 6 * MIN, USD, sent=NOW + UNHEARD_GRACE_MS + 1),
                   offsets=[a.offset])
    assert sorted(restarted.agg.windows) == [T0 + 6 * MIN]  # the older ones closed


def test_with_many_minutes_open_the_score_adds_only_the_oldest_few(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two gates reading a backlog at their own pace: partition 1 days behind partition 0
    (both active) holds every minute in between open, each in its own minute. The score
    adds only the oldest SCORED_OPEN_MINUTES of them to its copy of the state (the ones
    nearest to complete), so a batch costs the same however far apart the partitions are."""
    a = Agg(row("detect"), partitions=2)
    a.feed(partial(1, T0, 3 * USD, 3))
    a.feed(*(partial(0, T0 + m * MIN, USD) for m in range(3 * 24 * 60)))
    assert len(a.agg.windows) == 3 * 24 * 60  # nothing closes: partition 1 is at T0
    added: list[int] = []
    real = aggregate.rolling_add

    def counting(s: Any, w: int, total: int, count: int, learn: bool = True) -> Any:
        added.append(w)
        return real(s, w, total, count, learn)

    monkeypatch.setattr(aggregate, "rolling_add", counting)
    a.feed(partial(0, T0 + 5000 * MIN, USD))
    assert added == [T0 + m * MIN for m in range(SCORED_OPEN_MINUTES)]
    a.feed(partial(1, T0 + MIN, 2 * USD, 2))
    assert a.agg.windows[T0 + MIN] == (3 * USD, 3, 0)  # the lagging money in its minute


def test_a_surge_read_from_a_backlog_with_partitions_far_apart_trips() -> None:
    """The same backlog shape as above with a tripled hour in both partitions: the score
    near the lagging partition's minutes sees it once that partition reaches it."""
    a = Agg(row("enforce"), partitions=2)
    tripped: list[Trip] = []
    batch: list[bytes] = []
    surge = range(2 * WEEK_MIN + 120, 2 * WEEK_MIN + 180)
    for m in range(2 * WEEK_MIN + 600):
        batch.append(partial(0, T0 + m * MIN, (15 if m in surge else 5) * USD,
                             15 if m in surge else 5))
        if m >= 300:  # partition 1 runs five hours behind
            lag = m - 300
            batch.append(partial(1, T0 + lag * MIN, (15 if lag in surge else 5) * USD,
                                 15 if lag in surge else 5))
        if m % 10 == 9:
            tripped += a.feed(*batch)
            batch = []
    assert len(tripped) == 1
    start = (tripped[0].window_start_ms - T0) // MIN
    assert surge.start - 60 <= start <= surge.start + 10, start


def _close(a: Agg, at: int = NOW + 1) -> None:
    a.agg.halts.apply(StateChange(GLOBAL_SCOPE, "value_rate", HaltState.CLOSED, at))


def _tripped_by_a_surge(a: Agg) -> int:
    """History, an hour more, then +200 % for 5 minutes (it trips); the next minute."""
    w = _history(a)
    a.feed(*(partial(0, w + m * MIN, 10 * USD, 10) for m in range(61)))
    w += 61 * MIN
    trips = [t for m in range(5) for t in a.feed(partial(0, w + m * MIN, 30 * USD, 30))]
    assert len(trips) == 1
    return w + 5 * MIN


def test_a_closed_halt_does_not_trip_again_on_the_minutes_it_was_closed_over() -> None:
    """Closed while the surge is still inside the 15- and 60-min spans: normal minutes
    after the close do not trip again; the spans judge from the close on."""
    a = Agg(row("enforce"))
    w = _tripped_by_a_surge(a)
    a.feed(partial(0, w, 10 * USD, 10))
    _close(a)
    for m in range(1, 20):
        assert a.feed(partial(0, w + m * MIN, 10 * USD, 10)) == [], m
    # the minute after the newest of the batch that saw it
    assert a.agg.since == (w + MIN) // MIN + 1
    assert a.agg.halts.halts == {}
    sixty = next(sc for sc in a.agg.last.scores if sc.span == 60)  # type: ignore[union-attr]
    assert sixty.seen == 18  # from that minute to the open one


def test_a_halt_closed_the_moment_its_surge_ends_does_not_trip_on_its_last_minute() -> None:
    """Closed while the newest minute known is still a surge minute (more of its money
    arrives after the close): that minute is not judged again, the minutes after it are."""
    a = Agg(row("enforce"))
    end = _tripped_by_a_surge(a)  # the surge's last minute is end - MIN, still open
    _close(a)
    assert a.feed(partial(0, end - MIN, 70 * USD, 70)) == []  # $40 more, after the close
    assert a.agg.since == end // MIN
    for m in range(0, 20):
        assert a.feed(partial(0, end + m * MIN, 10 * USD, 10)) == [], m

    b = Agg(row("enforce"))  # the control: the same, judged from the surge's last minute
    assert _tripped_by_a_surge(b) == end
    _close(b)
    assert b.feed(partial(0, end - MIN, 31 * USD, 31)) == []
    b.agg.since = (end - MIN) // MIN
    assert b.feed(partial(0, end - MIN, 70 * USD, 70)) != []


def test_without_the_close_rule_the_same_minutes_would_trip_again() -> None:
    """The control for the test above: the same minutes, scored with no ``since``, are over
    (so the test above shows the rule, not a quiet stretch)."""
    a = Agg(row("enforce"))
    w = _tripped_by_a_surge(a)
    a.feed(partial(0, w, 10 * USD, 10))
    _close(a)
    a.feed(partial(0, w + MIN, 10 * USD, 10))
    a.agg.since = None
    assert a.feed(partial(0, w + 2 * MIN, 10 * USD, 10)) != []


def test_a_surge_after_the_close_trips_again() -> None:
    a = Agg(row("enforce"))
    w = _tripped_by_a_surge(a)
    a.feed(partial(0, w, 10 * USD, 10))
    _close(a)
    a.feed(*(partial(0, w + m * MIN, 10 * USD, 10) for m in range(1, 3)))
    trips = [t for m in range(3, 9)  # wall clock after the close, as it would be
             for t in a.feed(partial(0, w + m * MIN, 40 * USD, 40), now=NOW + 2)]
    assert len(trips) == 1 and trips[0].window_start_ms >= w


def test_an_instance_taking_over_after_the_close_re_arms_at_it() -> None:
    """The halt flag is in the table: an instance restored from it after the halt was
    closed (it never saw the halt itself) still applies the close rule."""
    a = Agg(row("enforce"))
    w = _tripped_by_a_surge(a)
    a.feed(partial(0, w, 10 * USD, 10))
    assert a.store[GLOBAL_ROLL]["halted"] is True
    b = Agg(row("enforce"), store=a.store)  # its halt book: closed
    b.offset = a.offset
    for m in range(1, 20):
        assert b.feed(partial(0, w + m * MIN, 10 * USD, 10)) == [], m
    assert b.agg.since == (w + MIN) // MIN + 1
    assert b.store[GLOBAL_ROLL]["halted"] is False


def test_hours_closed_while_the_global_scope_is_halted_are_not_learnt() -> None:
    """A held incident does not raise the expectation of its hours in later weeks: while
    the global scope is halted, closed hours leave the hour-of-week profile as it was;
    after the close, hours are learnt again."""
    a = Agg(row("enforce"))
    w = _tripped_by_a_surge(a)
    profile, st = a.agg.state.profile, a.agg.state.st
    for m in range(3 * 60):  # three hours of the incident going on, +500 %
        a.feed(partial(0, w + m * MIN, 60 * USD, 60))
    assert a.agg.state.profile == profile and a.agg.state.st == st
    w += 3 * 60 * MIN
    _close(a)
    for m in range(2 * 60):
        a.feed(partial(0, w + m * MIN, 10 * USD, 10))
    assert a.agg.state.profile != profile  # learning again
