"""Reconciliation of attempt intents (postbacks/core/intents.py): which intents are lost."""

from __future__ import annotations

import pytest

from postbacks.core.intents import Intent, Lost, Seen, lost_intents, lost_message

T = 1_700_000_000_000
AFTER = 60_000


def _i(aid: str = "att_1", dlv: str = "dlv_1", at: int = T, inst: str | None = "a/run1") -> Intent:
    return Intent(aid, dlv, at, inst)


def _s(aid: str = "att_2", dlv: str = "dlv_1", at: int = T + 5,
       inst: str | None = "a/run2") -> Seen:
    return Seen(aid, dlv, at, inst)


@pytest.mark.parametrize(
    ("intent", "seen", "now", "want"),
    [
        # another process attempts the delivery again: lost at once
        (_i(), [_s()], T + 10, "superseded"),
        # the same process sending a second copy beside it: not a sign of anything
        (_i(), [_s(inst="a/run1")], T + 10, None),
        # another delivery: irrelevant
        (_i(), [_s(dlv="dlv_2")], T + 10, None),
        # a record older than the intent (read late) does not supersede it
        (_i(), [_s(at=T - 1)], T + 10, None),
        # the same timestamp does (the restarted agent can be that fast)
        (_i(), [_s(at=T)], T + 10, "superseded"),
        # the intent itself, read in the same batch, is not its own rival
        (_i(), [_s(aid="att_1", inst="a/run2")], T + 10, None),
        # no instance (an agent before v2) on either side: only time decides
        (_i(inst=None), [_s()], T + 10, None),
        (_i(), [_s(inst=None)], T + 10, None),
        # time: just before, at, after the bound
        (_i(), [], T + AFTER - 1, None),
        (_i(), [], T + AFTER, "no_result"),
        (_i(inst=None), [], T + AFTER + 1, "no_result"),
    ],
)
def test_when_an_intent_is_lost(intent: Intent, seen: list[Seen], now: int,
                                want: str | None) -> None:
    got = lost_intents([intent], seen, now_ms=now, lost_after_ms=AFTER)
    assert [x.reason for x in got] == ([want] if want else [])


def test_each_lost_intent_once_in_order_and_named_by_its_rival() -> None:
    a, b, c = _i("att_a", "dlv_1"), _i("att_b", "dlv_2"), _i("att_c", "dlv_3", at=T - AFTER)
    seen = [_s("att_x", "dlv_1"), _s("att_y", "dlv_1"), _s("att_z", "dlv_3")]
    got = lost_intents([a, b, c], seen, now_ms=T + 10, lost_after_ms=AFTER)
    assert got == [Lost(a, "superseded", "att_x"), Lost(c, "superseded", "att_z")]


def test_the_message_says_the_receiver_may_have_it() -> None:
    msg = lost_message(Lost(_i(), "superseded", "att_x"))
    assert "may have received" in msg and "att_x" in msg and msg.startswith("a/run1 ")
    assert "in time" in lost_message(Lost(_i(), "no_result"))
