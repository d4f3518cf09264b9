"""Persisting a scope's gate state in a table: hist/open values, offsets, partials."""

from __future__ import annotations

import json
from typing import Any

import pytest

from postbacks.core.anomaly import BaselinePolicy, SeasonalBaseline, add, baseline, empty
from postbacks.core.anomaly.persist import (
    NOTHING,
    Tracked,
    dump_partial,
    dump_scope,
    restore_partial,
    restore_scope,
)
from postbacks.core.anomaly.rollup import PartitionPartial
from postbacks.core.anomaly.windows import HOUR_MS, WEEK_MS

T0 = 1_700_000_000_000 - 1_700_000_000_000 % HOUR_MS  # an hour boundary


def _json(value: Any) -> Any:
    """What the table's JSON serializer hands back."""
    return json.loads(json.dumps(value))


def _history(weeks: int = 3, start: int = T0) -> SeasonalBaseline:
    """Hourly windows over ``weeks`` weeks with payouts that vary by hour and week."""
    st = empty()
    for h in range(weeks * 168):
        ts = start + h * HOUR_MS + 60_000
        st = add(st, ts, 1_000_000 + (h % 24) * 10_000 + (h // 168) * 7)
        if h % 5 == 0:  # a second event in some windows
            st = add(st, ts + 1_000, 333)
    return st


# --- round trip ---------------------------------------------------------------------------


def test_round_trip_of_a_baseline_with_history() -> None:
    st = _history()
    assert st.open_start is not None and st.open_baseline is not None  # a real history
    hist, open_, after = dump_scope(Tracked(st, offset=42))
    assert hist is not None
    assert after.persisted_start == st.open_start
    back = restore_scope(_json(hist), _json(open_))
    assert back.state == st
    assert back.offset == 42
    assert back.persisted_start == st.open_start
    assert back.extra == {}
    assert baseline(back.state, st.open_start) == baseline(st, st.open_start)


def test_round_trip_carries_extra_and_open_extra_wins() -> None:
    st = _history(weeks=1)
    hist, _, t = dump_scope(Tracked(st, offset=5, extra={"parts": {"v": 1, "partials": ""}}))
    t = Tracked(add(t.state, st.open_start or 0, 7), 9, t.persisted_start,
                {"parts": {"v": 1, "partials": "0:1:2"}})
    hist2, open_, _ = dump_scope(t)
    assert hist2 is None  # same window: only the open value
    back = restore_scope(_json(hist), _json(open_))
    assert back.extra == {"parts": {"v": 1, "partials": "0:1:2"}}
    assert back.offset == 9
    assert back.state.open_total == st.open_total + 7


def test_restore_with_a_policy_trims_the_history() -> None:
    st = _history(weeks=4)
    hist, open_, _ = dump_scope(Tracked(st, offset=1))
    back = restore_scope(_json(hist), _json(open_), BaselinePolicy(weeks=2, min_weeks=2))
    assert back.state.policy.weeks == 2
    assert all(len(s) <= 2 for s in back.state.history)
    assert back.state.history == tuple(s[-2:] for s in st.history)


# --- hist only when the open window moved -------------------------------------------------


def test_hist_only_when_the_open_window_moved() -> None:
    st = add(empty(), T0 + 10, 100)
    hist, open_, t = dump_scope(Tracked(st, offset=0))
    assert hist is not None and hist["o"] == 0
    assert open_ == {"s": T0, "t": 100, "o": 0, "x": {}}

    t = Tracked(add(t.state, T0 + 20, 50), 1, t.persisted_start)  # same window
    hist, open_, t = dump_scope(t)
    assert hist is None
    assert open_["t"] == 150 and open_["o"] == 1

    t = Tracked(add(t.state, T0 + HOUR_MS, 5), 2, t.persisted_start)  # next window
    hist, open_, t = dump_scope(t)
    assert hist is not None and hist["open_start"] == T0 + HOUR_MS and hist["o"] == 2
    assert t.persisted_start == T0 + HOUR_MS
    again, _, _ = dump_scope(t)
    assert again is None


def test_restored_state_does_not_rewrite_hist_until_the_window_moves() -> None:
    hist, open_, _ = dump_scope(Tracked(_history(weeks=1), offset=3))
    back = restore_scope(_json(hist), _json(open_))
    assert dump_scope(back)[0] is None
    moved = Tracked(add(back.state, (back.state.open_start or 0) + HOUR_MS, 1), 4,
                    back.persisted_start)
    assert dump_scope(moved)[0] is not None


def test_hist_then_open_of_the_same_window_joins_them() -> None:
    st = add(empty(), T0, 100)
    hist, _, t = dump_scope(Tracked(st, offset=10))
    later = add(add(t.state, T0 + 5, 20), T0 + 6, 30)
    _, open_, _ = dump_scope(Tracked(later, 12, t.persisted_start))
    back = restore_scope(_json(hist), _json(open_))
    assert back.state == later
    assert back.offset == 12


# --- the open value that does not apply ---------------------------------------------------


def test_open_of_another_window_is_ignored() -> None:
    """``hist`` for window W+1 landed, the ``open`` for it did not: W's open stands out."""
    old = add(empty(), T0, 100)
    _, stale_open, t = dump_scope(Tracked(old, offset=50))
    moved = add(old, T0 + HOUR_MS, 7)
    hist, _, _ = dump_scope(Tracked(moved, 60, t.persisted_start))
    assert hist is not None
    stale_open = {**stale_open, "o": 99, "t": 12345}  # even with a higher offset
    back = restore_scope(_json(hist), _json(stale_open))
    assert back.state == moved
    assert back.state.open_total == 7
    assert back.offset == 60


def test_open_with_a_lower_offset_than_hist_is_ignored() -> None:
    st = add(empty(), T0, 100)
    hist, open_, _ = dump_scope(Tracked(st, offset=20))
    older = {**open_, "t": 40, "o": 15}
    back = restore_scope(_json(hist), _json(older))
    assert back.state.open_total == 100
    assert back.offset == 20


def test_open_with_bad_fields_is_ignored() -> None:
    st = add(empty(), T0, 100)
    hist, open_, _ = dump_scope(Tracked(st, offset=20))
    for bad in ({**open_, "t": "900", "o": 30}, {**open_, "t": 900, "o": "30"},
                {**open_, "t": 900, "o": 30, "x": [1]}):
        back = restore_scope(hist, bad)
        assert back.state.open_total == 100 and back.offset == 20


def test_open_with_equal_offset_applies() -> None:
    st = add(empty(), T0, 100)
    hist, open_, _ = dump_scope(Tracked(st, offset=20))
    back = restore_scope(hist, {**open_, "t": 130})
    assert back.state.open_total == 130 and back.offset == 20


# --- malformed values ---------------------------------------------------------------------


def _good_hist() -> dict[str, Any]:
    hist, _, _ = dump_scope(Tracked(add(empty(), T0, 1), offset=0))
    assert hist is not None
    return hist


@pytest.mark.parametrize("mutate", [
    lambda h: "not a dict",
    lambda h: [h],
    lambda h: {**h, "o": "3"},
    lambda h: {k: v for k, v in h.items() if k != "o"},
    lambda h: {**h, "x": [1, 2]},
    lambda h: {**h, "v": 99},
    lambda h: {**h, "history": "1,2;x"},
    lambda h: {**h, "history": ";;"},
    lambda h: {**h, "history": 7},
    lambda h: {**h, "open_total": 1.5},
    lambda h: {**h, "window_ms": 7},
])
def test_malformed_hist_raises(mutate: Any) -> None:
    with pytest.raises(ValueError):
        restore_scope(mutate(_good_hist()), None)


def test_malformed_open_raises() -> None:
    with pytest.raises(ValueError):
        restore_scope(_good_hist(), "garbage")


def test_other_window_size_is_refused() -> None:
    with pytest.raises(ValueError):
        restore_scope(_good_hist(), None, BaselinePolicy(window_ms=HOUR_MS // 2))


# --- nothing persisted --------------------------------------------------------------------


def test_restore_of_nothing_is_empty() -> None:
    t = restore_scope(None, None)
    assert t.state == empty()
    assert t.offset == NOTHING == -1
    assert t.persisted_start is None and t.extra == {}
    # an ``open`` for a window without its history (a lost write) is not trusted ...
    assert restore_scope(None, {"s": 3_600_000, "t": 5, "o": 7, "x": {}}).offset == NOTHING
    # ... but a state that never opened a window has nothing but ``open`` to persist
    assert restore_scope(None, {"s": None, "t": 0, "o": 7, "x": {}}).offset == 7
    p = BaselinePolicy(weeks=3, min_weeks=1)
    assert restore_scope(None, None, p).state == empty(p)


def test_untouched_scope_dumps_only_open() -> None:
    hist, open_, t = dump_scope(Tracked(empty()))
    assert hist is None
    assert open_ == {"s": None, "t": 0, "o": NOTHING, "x": {}}
    assert t.persisted_start is None


# --- partition partials -------------------------------------------------------------------


@pytest.mark.parametrize(("part", "offset"), [
    (PartitionPartial(T0, 123_456), 7),
    (PartitionPartial(T0 + WEEK_MS, 0), 0),
    (PartitionPartial(), NOTHING),
])
def test_partial_round_trip(part: PartitionPartial, offset: int) -> None:
    assert restore_partial(_json(dump_partial(part, offset))) == (part, offset)


def test_restore_partial_of_nothing() -> None:
    assert restore_partial(None) == (PartitionPartial(), NOTHING)


@pytest.mark.parametrize("raw", [
    "x", [1], {"w": "1", "t": 1, "o": 1}, {"w": 1, "t": None, "o": 1},
    {"w": 1, "t": 1}, {"w": 1, "t": 1, "o": 1.0}, {"w": 1.5, "t": 1, "o": 1},
])
def test_malformed_partial_raises(raw: object) -> None:
    with pytest.raises(ValueError):
        restore_partial(raw)


def test_a_state_that_never_opened_a_window_restores_from_open_alone() -> None:
    t = Tracked(empty(), offset=7, extra={"wins": "1:2"})
    hist, open_, _ = dump_scope(t)
    assert hist is None  # nothing to write: no window has opened
    back = restore_scope(None, open_)
    assert (back.offset, back.extra, back.state.open_start) == (7, {"wins": "1:2"}, None)
