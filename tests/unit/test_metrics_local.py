"""LocalCounter / LocalHistogram expose exactly what prometheus_client's Counter and
Histogram expose for the same updates (the ``_created`` samples aside)."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from postbacks.metrics_local import LocalCounter, LocalHistogram

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# On a bound, between bounds, below the first, beyond the last, zero, negative.
VALUES = [0.001, 0.0025, 0.0031, 0.0, -0.5, 0.7, 1.0, 60.0, 61.0, 1e9, 0.00099, 29.999]


def _page(registry: CollectorRegistry) -> list[str]:
    text = generate_latest(registry).decode()
    return sorted(line for line in text.splitlines() if "_created" not in line)


def test_a_local_histogram_exposes_what_a_prometheus_histogram_does() -> None:
    ref, mine = CollectorRegistry(), CollectorRegistry()
    h = Histogram("webhook_delivery_latency_seconds", "Delivery latency split by phase",
                  ["phase"], buckets=BUCKETS, registry=ref)
    m = LocalHistogram("webhook_delivery_latency_seconds", "Delivery latency split by phase",
                       ["phase"], buckets=BUCKETS, registry=mine)
    for i, v in enumerate(VALUES):
        phase = ("queue", "wire", "platform")[i % 3]
        h.labels(phase).observe(v)
        m.labels(phase).observe(v)
    h.labels(phase="relay_lateness").observe(0.02)
    m.labels(phase="relay_lateness").observe(0.02)
    assert _page(mine) == _page(ref)
    assert any('le="+Inf"' in line for line in _page(mine))


def test_a_local_counter_exposes_what_a_prometheus_counter_does() -> None:
    ref, mine = CollectorRegistry(), CollectorRegistry()
    c = Counter("webhook_outcomes_total", "Outcome events produced", ["kind"], registry=ref)
    m = LocalCounter("webhook_outcomes_total", "Outcome events produced", ["kind"],
                     registry=mine)
    for kind, n in (("delivered", 5), ("failing", 1), ("exhausted", 0)):
        c.labels(kind).inc(n)
        m.labels(kind).inc(n)
    c.labels(kind="delivered").inc()
    m.labels(kind="delivered").inc()
    assert _page(mine) == _page(ref)
    assert 'webhook_outcomes_total{kind="delivered"} 6.0' in _page(mine)


def test_local_metrics_refuse_what_prometheus_refuses() -> None:
    m = LocalCounter("x_total", "x", ["kind"], registry=None)
    with pytest.raises(ValueError):
        m.labels("a").inc(-1)
    with pytest.raises(ValueError):
        m.labels(other="a")
    with pytest.raises(ValueError):
        m.labels("a", "b")
    with pytest.raises(ValueError):
        LocalHistogram("y", "y", ["a", "b"], buckets=(1,), registry=None)
    with pytest.raises(ValueError):
        LocalHistogram("y", "y", ["a"], buckets=(2, 1), registry=None)
    with pytest.raises(ValueError):
        LocalHistogram("y", "y", ["a"], buckets=(1, 1, 2), registry=None)
    h = LocalHistogram("y", "y", ["a"], buckets=(1, math.inf), registry=None)
    h.labels("z").observe(2)
    assert h.labels("z").counts == [0, 1]  # +Inf given once is not doubled


def test_nan_is_counted_as_prometheus_client_counts_it() -> None:
    ref, mine = CollectorRegistry(), CollectorRegistry()
    h = Histogram("lat_seconds", "x", ["phase"], buckets=BUCKETS, registry=ref)
    m = LocalHistogram("lat_seconds", "x", ["phase"], buckets=BUCKETS, registry=mine)
    for v in (0.3, math.nan):
        h.labels("wire").observe(v)
        m.labels("wire").observe(v)
    assert _page(mine) == _page(ref)


def test_a_name_taken_twice_in_one_registry_is_refused() -> None:
    reg = CollectorRegistry()
    LocalCounter("webhook_outcomes_total", "x", ["kind"], registry=reg)
    with pytest.raises(ValueError):
        Counter("webhook_outcomes_total", "x", ["kind"], registry=reg)
