"""A delivery's end is recorded whatever its payout: a negative one (another producer's;
the fan-out refuses them) used to raise in the payout counter after the POST, so the
attempt and the delivered outcome were thrown away and the delivery dead-lettered."""

from __future__ import annotations

from typing import Any

from postbacks.core.retry import RetryPolicy
from postbacks.metrics import PAYOUT_USD
from streams.delivery import Deliverer
from tests.unit.factories import make_conversion, make_delivery


def counted(kind: str) -> float:
    return sum(s.value for m in PAYOUT_USD.collect() for s in m.samples
               if s.labels.get("outcome", s.labels.get("kind")) == kind
               and s.name.endswith("_total"))


def test_a_negative_payout_ends_like_any_other() -> None:
    deliverer = Deliverer(None, RetryPolicy())  # type: ignore[arg-type]  # never sends
    before = counted("delivered")
    for micros, adds in ((-1_000_000, 0.0), (2_500_000, 2.5)):
        out: list[Any] = []
        d: Any = make_delivery(conversion=make_conversion(payout_usd_micros=micros))
        deliverer.outcome(out, d, "delivered", 1_700_000_000_000)
        assert [topic for topic, _, _ in out] == ["outcomes.v1"]
        assert counted("delivered") == before + adds
        before += adds
