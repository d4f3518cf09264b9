"""The gate's seek fence for Faust's fetch loop (streams/anomaly_gate/faust_patches.fence),
over a stand-in consumer: a batch whose fetch a seek overtook never reaches the streams
(changelog records excepted) and the partitions are sought to their committed offsets
again; a seek during a batch's hand-over is followed by another before the next fetch; a
partition never committed is sought to its beginning."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, NamedTuple

from streams.anomaly_gate.faust_patches import fence

CHANGELOG = "gate-endpoints-changelog"


class TP(NamedTuple):
    topic: str
    partition: int


SRC, LOG = TP("deliveries.v1", 0), TP(CHANGELOG, 0)


def make_consumer(committed: dict[TP, int | None]) -> Any:
    """A fresh stand-in class (the fence patches classes) and one instance of it."""

    class Thread:
        def __init__(self) -> None:
            self.to_beginning: list[TP] = []

        async def seek_to_beginning(self, *tps: TP) -> None:
            self.to_beginning += tps

    class Consumer:
        def __init__(self) -> None:
            self.app = SimpleNamespace(tables=SimpleNamespace(changelog_topics={CHANGELOG}))
            self._thread = Thread()
            self.seeks = 0
            self.during_fetch: Callable[[], Any] | None = None
            self.next_records: dict[TP, list[int]] = {}
            self.fail_seeks = 0

        async def _wait_next_records(self, timeout: float) -> Any:  # noqa: ASYNC109
            if self.during_fetch is not None:  # the rebalance lands while the fetch waits
                await self.during_fetch()
                self.during_fetch = None
            return dict(self.next_records), None

        async def perform_seek(self) -> None:
            self.seeks += 1
            if self.fail_seeks:
                self.fail_seeks -= 1
                raise AssertionError("No partitions are currently assigned")  # aiokafka's
            await self.seek_to_committed()

        async def seek(self, partition: TP, offset: int) -> None:
            self.seeks += 1

        async def seek_to_committed(self) -> dict[TP, int | None]:
            return dict(committed)

    fence(Consumer, Consumer)
    return Consumer()


def fetch(c: Any) -> Any:
    records, _active = asyncio.run(c._wait_next_records(1.0))
    return records


def test_a_batch_without_a_seek_passes_untouched() -> None:
    c = make_consumer({SRC: 10})
    c.next_records = {SRC: [10, 11], LOG: [3]}
    assert fetch(c) == {SRC: [10, 11], LOG: [3]}
    assert fetch(c) == {SRC: [10, 11], LOG: [3]}
    assert c.seeks == 0


def test_a_batch_a_seek_overtook_is_dropped_and_the_partitions_sought_again() -> None:
    c = make_consumer({SRC: 10})
    c.next_records = {SRC: [500, 501], LOG: [3]}  # fetched at the old position
    c.during_fetch = c.perform_seek  # the rebalance's seek to committed
    assert fetch(c) == {LOG: [3]}  # no seek moves a changelog partition here
    assert c.seeks == 2  # the rebalance's, and the fence's
    c.next_records = {SRC: [10, 11]}
    assert fetch(c) == {SRC: [10, 11]}  # read again from the committed offset
    assert c.seeks == 2


def test_a_seek_during_a_hand_over_is_followed_by_another_before_the_next_fetch() -> None:
    c = make_consumer({SRC: 10})
    c.next_records = {SRC: [500, 501]}
    assert fetch(c) == {SRC: [500, 501]}
    asyncio.run(c.perform_seek())  # a rebalance while the batch is being handed over
    assert c.seeks == 1
    c.next_records = {SRC: [10]}
    assert fetch(c) == {SRC: [10]}  # the read offsets are set right again first
    assert c.seeks == 2
    assert fetch(c) == {SRC: [10]} and c.seeks == 2  # once


def test_a_seek_between_batches_changes_nothing() -> None:
    c = make_consumer({SRC: 10})
    c.next_records = {}
    assert fetch(c) == {}
    asyncio.run(c.seek(SRC, 10))
    c.next_records = {SRC: [10]}
    assert fetch(c) == {SRC: [10]} and c.seeks == 1


def test_a_partition_never_committed_is_sought_to_its_beginning() -> None:
    other = TP("anomaly.partials.v1", 0)
    c = make_consumer({SRC: None, other: 0, TP("deliveries.v1", 1): 7, LOG: None})
    asyncio.run(c.perform_seek())
    assert c._thread.to_beginning == [SRC, other]  # not the changelog, not the committed


def test_a_failed_seek_is_tried_again_before_anything_is_fetched() -> None:
    c = make_consumer({SRC: 10})
    c.next_records = {SRC: [500]}

    async def rebalance() -> None:
        await c.perform_seek()
        c.fail_seeks = 1  # the fence's own seek fails (the assignment is empty for a moment)

    c.during_fetch = rebalance
    assert fetch(c) == {}
    assert c.seeks == 2  # the rebalance's and the failed one
    c.next_records = {SRC: [10]}
    assert fetch(c) == {SRC: [10]}  # sought again first, then fetched from there
    assert c.seeks == 3
    assert fetch(c) == {SRC: [10]} and c.seeks == 3
