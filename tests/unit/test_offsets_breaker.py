from __future__ import annotations

import pytest

from postbacks.core.breaker import BreakerPolicy, BreakerState, Divert, Send, admit, on_result
from streams.offsets import Tracker, decode_done, encode_done


def test_every_finished_record_is_drained_with_a_commit_that_covers_it() -> None:
    t = Tracker()
    a, b, c = (t.track("dispatch", 0, o) for o in (10, 11, 12))
    other = t.track("dispatch", 1, 5)
    c.finish([("x", None, b"c")])  # finishes first: drained at once, offset stays at 10
    items, commits = t.drain()
    assert items == [("x", None, b"c")]
    assert commits == {("dispatch", 0): (10, encode_done(10, [12]))}
    assert decode_done(10, commits[("dispatch", 0)][1]) == {12}
    assert t.drain() == ([], {})  # nothing new: nothing to commit
    a.finish([("x", None, b"a")])
    other.finish([])
    items, commits = t.drain()
    assert items == [("x", None, b"a")]
    assert commits == {("dispatch", 0): (11, encode_done(11, [12])), ("dispatch", 1): (6, "")}
    assert t.unfinished() == 1
    b.finish([("x", None, b"b")])
    items, commits = t.drain()
    assert items == [("x", None, b"b")] and commits == {("dispatch", 0): (13, "")}
    assert t.unfinished() == 0 and t.pending() == 0


def test_span_limit_holds_back_records_too_far_above_the_committed_offset() -> None:
    t = Tracker(max_span=10)
    t.track("d", 0, 0)
    far = t.track("d", 0, 50)
    far.finish([("x", None, b"far")])
    assert t.drain() == ([], {})


def test_revoked_partition_is_forgotten_and_late_finishes_do_not_count() -> None:
    t = Tracker()
    s = t.track("d", 0, 1)
    t.forget("d", 0)
    assert t.unfinished() == 0
    s.finish([("x", None, b"late")])
    assert t.drain() == ([], {}) and t.unfinished() == 0


@pytest.mark.parametrize("done", [[], [101], [100, 105, 9000], list(range(100, 5100, 3))])
def test_done_bitmap_roundtrip_fits_kafka_metadata(done: list[int]) -> None:
    meta = encode_done(100, done)
    assert decode_done(100, meta) == set(done)
    assert len(meta) < 4096


@pytest.mark.parametrize("meta", [None, "", "garbage", "pc1:!!!", "pc1:YWJj"])
def test_unknown_metadata_means_nothing_to_skip(meta: str | None) -> None:
    assert decode_done(0, meta) == set()


P = BreakerPolicy(failure_threshold=3, open_s=10, ramp_s=100)


def _fail(s: BreakerState, n: int, now: int = 0) -> BreakerState:
    for _ in range(n):
        s = on_result(P, s, now, failed=True, probe=False)
    return s


def test_opens_after_consecutive_failures_and_diverts_until_the_period_ends() -> None:
    s = _fail(BreakerState(), 2)
    assert s.state == "closed"
    s = on_result(P, s, 0, failed=False, probe=False)
    assert s.consecutive_failures == 0
    s = _fail(s, 3, now=1000)
    assert s.state == "open"
    decision, _ = admit(P, s, 5000, 4)
    assert decision == Divert("breaker_open", 11_000)


def test_one_probe_then_ramp_then_closed() -> None:
    s = _fail(BreakerState(), 3, now=0)
    decision, s = admit(P, s, 10_000, 4)
    assert decision == Send(1, probe=True) and s.state == "half_open"
    decision2, _ = admit(P, s, 10_001, 4)
    assert isinstance(decision2, Divert) and decision2.reason == "breaker_probing"
    s = on_result(P, s, 10_500, failed=False, probe=True)
    assert s.state == "ramping"
    assert admit(P, s, 10_500, 10)[0] == Send(1)  # 10 % of the cap
    assert admit(P, s, 10_500 + 50_000, 10)[0] == Send(5)  # half way: 55 %
    decision3, s = admit(P, s, 10_500 + 100_000, 10)
    assert decision3 == Send(10) and s.state == "closed"


def test_failed_probe_reopens() -> None:
    s = _fail(BreakerState(), 3, now=0)
    _, s = admit(P, s, 10_000, 4)
    s = on_result(P, s, 10_200, failed=True, probe=True)
    assert s.state == "open" and s.opened_at_ms == 10_200


@pytest.mark.parametrize("cap", [1, 4, 64])
def test_closed_breaker_allows_the_cap(cap: int) -> None:
    assert admit(P, BreakerState(), 0, cap)[0] == Send(cap)
