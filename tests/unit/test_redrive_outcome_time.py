"""A re-drive's outcomes are dated after the console's own outcome for it. The console
dates its ``replayed``/``released`` outcome, and the re-driven delivery's ``due_at``, by
its clock; the sink takes a delivery's status from its latest outcome. With the
console's clock a second ahead of the agent's, ``delivered`` was dated before
``replayed``, and the delivery stayed ``replayed`` (a gap, and not replayable again)."""

from __future__ import annotations

from typing import Any

from postbacks.codec import codec_for
from postbacks.core.retry import RetryPolicy
from streams.delivery import Deliverer
from tests.unit.factories import make_delivery

NOW = 1_700_000_100_000
_OUT = codec_for("Outcome")


def _dated(**over: Any) -> int:
    deliverer = Deliverer(None, RetryPolicy())  # type: ignore[arg-type]
    out: list[Any] = []
    deliverer.outcome(out, make_delivery(**over), "delivered", NOW)
    [(_topic, _key, value)] = out
    return int(_OUT.decode(value)["occurred_at"])


def test_a_replay_from_a_console_running_ahead_is_delivered_after_its_replayed() -> None:
    assert _dated(trigger="manual", due_at=NOW + 1_500) == NOW + 1_501
    assert _dated(trigger="release", due_at=NOW + 20) == NOW + 21


def test_other_deliveries_and_far_clocks_keep_the_agents_time() -> None:
    assert _dated(trigger="manual", due_at=NOW - 5_000) == NOW  # a normal replay: due before
    assert _dated(trigger="retry", due_at=NOW + 1_500) == NOW  # the agent's own schedule
    assert _dated(trigger="manual", due_at=2**63 - 1) == NOW  # not a clock: another producer
