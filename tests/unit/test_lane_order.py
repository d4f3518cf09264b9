"""An endpoint lane's start order: re-drives (console replays, held releases) get every
4th free slot while live work waits, all of them when nothing else waits."""

from __future__ import annotations

from typing import Any, cast

from streams.lane import REDRIVE_SHARE, Lane, Work
from tests.unit.factories import make_delivery


def _work(n: int, trigger: str) -> Work:
    d = make_delivery(delivery_id=f"dlv_{n}", trigger=trigger)
    return Work(cast(Any, None), d, cast(Any, None))


def test_redrives_get_every_fourth_start_while_live_work_waits() -> None:
    lane = Lane("ep_1")
    for i in range(6):
        lane.push(_work(i, "initial" if i % 2 else "retry"))
    for i in range(6, 10):
        lane.push(_work(i, "manual" if i % 2 else "release"))
    assert lane.waiting() == 10
    order = [lane.pop().delivery["trigger"] for _ in range(10)]
    redrive = [t in ("manual", "release") for t in order]
    assert REDRIVE_SHARE == 4
    # live, live, live, redrive, live, live, live, redrive, then the redrives left
    assert redrive == [False, False, False, True, False, False, False, True, True, True]
    assert lane.waiting() == 0


def test_alone_a_redrive_is_not_held_back_and_order_within_a_kind_is_kept() -> None:
    lane = Lane("ep_1")
    for i in range(3):
        lane.push(_work(i, "manual"))
    assert [lane.pop().delivery["delivery_id"] for _ in range(3)] == ["dlv_0", "dlv_1", "dlv_2"]
