"""Hot-path counters and histograms kept as plain numbers, read by the registry at scrape.

prometheus_client's children take a lock on every ``inc`` and ``observe`` (1.2 and 2.5 µs
of CPU each on a slow host); the agent made five such calls per delivery, ~3 % of its
CPU. These keep a plain float per child (and one per bucket) and expose the same series
through a collector: same names, help, labels and buckets, without the ``_created``
samples.

One writer thread per process: ``+=`` on a Python attribute is not atomic across threads,
so a child must only be updated from one thread (the stage's event loop). A scrape reads
from the metrics server's thread, so a histogram's sum and its buckets may be a few
observations apart in one scrape (the next scrape has them all).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client import utils as _utils
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["LocalCounter", "LocalHistogram"]

C = TypeVar("C")  # a child
F = TypeVar("F", CounterMetricFamily, HistogramMetricFamily)  # its family

_go_float: Callable[[float], str] = _utils.floatToGoString  # how prometheus writes `le`


class _CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters can only be incremented by non-negative amounts")
        self.value += amount


class _HistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: list[float]) -> None:
        self.bounds = bounds  # upper bounds, +Inf last
        self.counts = [0] * len(bounds)  # per bucket, not cumulative
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.sum += amount
        if amount == amount:  # NaN joins the sum only (as in prometheus_client)
            self.counts[bisect.bisect_left(self.bounds, amount)] += 1  # first bound >= it


class _OneLabel(Collector, Generic[C, F]):
    """One label, children made on first use; subclasses say how to make and expose them."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 registry: CollectorRegistry | None) -> None:
        if len(labelnames) != 1:
            raise ValueError("one label exactly")
        self.name = name
        self.documentation = documentation
        self.label = labelnames[0]
        self._children: dict[str, C] = {}
        if registry is not None:
            registry.register(self)

    def _new_child(self) -> C:
        raise NotImplementedError

    def _family(self) -> F:
        raise NotImplementedError

    def _add(self, family: F, value: str, child: C) -> None:
        raise NotImplementedError

    def labels(self, *values: str, **labels: str) -> C:
        if labels:
            if values or set(labels) != {self.label}:
                raise ValueError(f"{self.name}: the label is {self.label!r}")
            value = str(labels[self.label])
        elif len(values) != 1:
            raise ValueError(f"{self.name}: one label value")
        else:
            value = str(values[0])
        got = self._children.get(value)
        if got is None:
            got = self._children[value] = self._new_child()
        return got

    def describe(self) -> list[Metric]:
        return [self._family()]

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for value, c in self._children.copy().items():  # one call: no resize mid-copy
            self._add(family, value, c)
        yield family


class LocalCounter(_OneLabel[_CounterChild, CounterMetricFamily]):
    """A one-label counter (``name`` ends in ``_total``); see the module doc."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 registry: CollectorRegistry | None = REGISTRY) -> None:
        super().__init__(name, documentation, labelnames, registry)

    def _new_child(self) -> _CounterChild:
        return _CounterChild()

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.documentation, labels=[self.label])

    def _add(self, family: CounterMetricFamily, value: str, child: _CounterChild) -> None:
        family.add_metric([value], child.value)


class LocalHistogram(_OneLabel[_HistogramChild, HistogramMetricFamily]):
    """A one-label histogram; see the module doc."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 buckets: Sequence[float], registry: CollectorRegistry | None = REGISTRY,
                 ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(set(bounds)):
            raise ValueError("buckets must be in increasing order, each once")
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        self._bounds = bounds
        self._les = [_go_float(b) for b in bounds]
        super().__init__(name, documentation, labelnames, registry)

    def _new_child(self) -> _HistogramChild:
        return _HistogramChild(self._bounds)

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=[self.label])

    def _add(self, family: HistogramMetricFamily, value: str, child: _HistogramChild) -> None:
        counts, total = list(child.counts), child.sum
        cumulative, buckets = 0, []
        for le, n in zip(self._les, counts, strict=True):
            cumulative += n
            buckets.append((le, float(cumulative)))
        family.add_metric([value], buckets, total)
