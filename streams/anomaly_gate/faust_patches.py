"""The gate's patches to faust-streaming 0.15, each applied once at import.

- :func:`patch_faust_gaps`: the gap record after a transaction marker excludes the record
  after the gap (the runner's module docstring says why).
- :func:`patch_faust_read_committed`: the stream consumer reads committed records only.
- :func:`patch_faust_eager_deliver`: the fetch loop hands each record to the streams
  without four tasks per record when nothing is in the way.
- :func:`patch_faust_seek_fence`: no record fetched before a seek is handed over after it,
  and a partition never committed restarts from its beginning.

**The seek fence.** After a rebalance Faust seeks every partition to its committed offset
and sets its read offset there; its fetch loop then accepts a record at or past the read
offset and, when the record is further on, records the offsets in between as a *gap* (for
transaction markers) that a commit passes as done. Two things broke that, both measured
with two gate instances and a backlog (test_anomaly_rolling's aggregator failover, 2 of 8
runs):

- *A batch fetched before the seek, handed over after it.* The fetch runs on the consumer
  thread; a rebalance (revoke, assign, seek) can complete while it waits, and Faust checks
  the consumer generation only after the batch has arrived. Its first record was 469
  offsets past the committed one: those became a gap, were committed, and their deliveries
  -- dropped from the stream's queue in the rebalance -- never reached dispatch or held.
  The fence counts seeks; a batch whose fetch overlapped one is dropped (except changelog
  records, whose positions no seek here moves) and every partition is sought to its
  committed offset again.
- *A read offset set after the seek.* A record whose hand-over was waiting when the flow
  was suspended has its read offset set once the wait ends -- after the seek -- so the
  fetch loop drops the records from the committed offset up to it, and the partition's
  commits stop there (a stall the progress watch restarts the process for). A seek that
  lands while a batch is being handed over marks it; before the next fetch, every partition
  is sought to its committed offset again, which sets the read offsets right.

A partition never committed is not moved by aiokafka's seek to committed, while Faust
forgets its read offset: records dropped from the queue in the rebalance would be skipped.
Such a partition (other than a changelog) is sought to its beginning, where a fresh
assignment would start (``auto.offset.reset`` earliest).

**Eager delivery.** Faust's fetch loop awaits, for every record,
``wait_first(callback(record), suspend_flow.wait())``: the callback puts the record on its
stream's queue, and the wait gives up on it if a rebalance suspends the flow while the
queue is full. ``mode``'s ``wait_first`` makes a task of each awaitable and of the
service's stopped and crashed events, then ``asyncio.wait`` on the four: measured at
37 µs a record on this 2-core host, against 0.1 µs to await the callback directly (the
gate took 264-324 µs a delivery in all without this patch, 196-230 µs with it:
docs/decisions/0004-faust-gate.md). The patched ``wait_first`` first runs the
callback's coroutine up to its first suspension (as an eager task would). Almost always it
finishes there, with the record on a queue that had room, and nothing else is needed. When
it does suspend (a full queue), the rest of it runs as a task and Faust's own
``wait_first`` waits on it and the suspended flow exactly as before. With the flow already
suspended, or a timeout, or any other arguments, the original runs unchanged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Generator
from typing import Any

__all__ = [
    "continue_coroutine",
    "fence",
    "patch_faust_eager_deliver",
    "patch_faust_gaps",
    "patch_faust_read_committed",
    "patch_faust_seek_fence",
]

log = logging.getLogger(__name__)


def patch_faust_gaps() -> None:
    """Make Faust's gap record exclude the record after the gap (see the runner)."""
    from faust.transport.consumer import Consumer as FaustConsumer

    original = FaustConsumer._add_gap
    if getattr(original, "postbacks_patched", False):
        return

    async def add_gap(self: Any, tp: Any, offset_from: int, offset_to: int) -> None:
        if offset_to - 1 >= offset_from:  # offset_to is a record read (and acked) itself
            await original(self, tp, offset_from, offset_to - 1)

    add_gap.postbacks_patched = True  # type: ignore[attr-defined]
    FaustConsumer._add_gap = add_gap  # type: ignore[method-assign]


def patch_faust_read_committed() -> None:
    """Make Faust's stream consumer read committed records only.

    faust-streaming 0.15 reads ``read_uncommitted`` unless the app runs its own (broken)
    exactly_once; fan-out writes deliveries.v1 in transactions, so the gate dispatched --
    and counted into its baselines -- deliveries of transactions that were later aborted
    (a fan-out crash mid-batch: the conversion is fanned out again, so the postback went
    twice and its payout was counted twice; a conversion never committed was paid for).
    aiokafka's fetcher takes the level from the consumer when it starts."""
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    original = AIOKafkaConsumerThread._create_worker_consumer
    if getattr(original, "postbacks_patched", False):
        return

    def create(self: Any, transport: Any) -> Any:
        consumer = original(self, transport)
        consumer._isolation_level = "read_committed"
        return consumer

    create.postbacks_patched = True  # type: ignore[attr-defined]
    AIOKafkaConsumerThread._create_worker_consumer = create  # type: ignore[method-assign]


class _Continued:
    """Awaitable running the rest of ``coro``, which has run up to yielding ``yielded``:
    what the event loop sends or throws goes on into ``coro``, as ``await`` would."""

    __slots__ = ("coro", "yielded")

    def __init__(self, coro: Coroutine[Any, Any, Any], yielded: Any) -> None:
        self.coro, self.yielded = coro, yielded

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, out = self.coro, self.yielded
        while True:
            try:
                sent = yield out
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # cancellation included: passed on into coro
                try:
                    out = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    out = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


async def continue_coroutine(coro: Coroutine[Any, Any, Any], yielded: Any) -> Any:
    """The rest of ``coro`` (stepped once, it yielded ``yielded``), as a coroutine."""
    return await _Continued(coro, yielded)


def patch_faust_eager_deliver() -> None:
    """Faust's consumer ``wait_first(callback(record), suspend_flow.wait())`` without tasks
    when the callback completes at once (see the module docstring)."""
    from faust.transport.consumer import Consumer as FaustConsumer
    from mode.services import WaitResults

    original = FaustConsumer.wait_first
    if getattr(original, "postbacks_patched", False):
        return

    # mode's signature, timeout included
    async def wait_first(self: Any, *coros: Any, timeout: Any = None) -> Any:  # noqa: ASYNC109
        if (len(coros) != 2 or timeout is not None or not asyncio.iscoroutine(coros[0])
                or not asyncio.iscoroutine(coros[1]) or self.suspend_flow.is_set()):
            return await original(self, *coros, timeout=timeout)
        first, flow = coros
        try:
            yielded = first.send(None)
        except StopIteration as stop:  # done: the record is on its queue
            flow.close()  # never started
            return WaitResults([first], [stop.value], False)
        except BaseException:
            flow.close()
            raise
        return await original(self, continue_coroutine(first, yielded), flow)

    wait_first.postbacks_patched = True  # type: ignore[attr-defined]
    FaustConsumer.wait_first = wait_first  # type: ignore[method-assign]


def _moved(consumer: Any) -> None:
    """A seek starts or ends: batches fetched across it are stale."""
    consumer.postbacks_seeks = getattr(consumer, "postbacks_seeks", 0) + 1
    if getattr(consumer, "postbacks_handing_over", False):
        consumer.postbacks_straddled = True


def patch_faust_seek_fence() -> None:
    """No record fetched before a seek handed over after it (see the module docstring)."""
    from faust.transport.consumer import Consumer as FaustConsumer
    from faust.transport.consumer import ThreadDelegateConsumer

    fence(FaustConsumer, ThreadDelegateConsumer)


def fence(base: Any, delegate: Any) -> None:
    """Patch the consumer class ``base`` (fetch and seeks) and its subclass ``delegate``
    (seek to committed, through the consumer thread) with the seek fence."""
    from postbacks.metrics import GATE_REFETCHES

    wait_next = base._wait_next_records
    if getattr(wait_next, "postbacks_patched", False):
        return
    perform_seek, seek = base.perform_seek, base.seek
    to_committed = delegate.seek_to_committed

    async def fenced_perform_seek(self: Any) -> None:
        _moved(self)
        try:
            await perform_seek(self)
        finally:
            _moved(self)

    async def fenced_seek(self: Any, partition: Any, offset: int) -> None:
        _moved(self)
        try:
            await seek(self, partition, offset)
        finally:
            _moved(self)

    async def seek_to_committed(self: Any) -> Any:
        committed = await to_committed(self)
        changelogs = self.app.tables.changelog_topics
        never = [tp for tp, off in committed.items()
                 if (off is None or off <= 0) and tp.topic not in changelogs]
        if never:
            await self._thread.seek_to_beginning(*never)
        return committed

    async def reseek(self: Any, reason: str) -> bool:
        GATE_REFETCHES.labels(reason).inc()
        try:
            await self.perform_seek()
            return True
        except Exception as exc:  # guarded as Faust guards its own seek in getmany
            log.warning("seek to committed offsets failed (%r): tried again before the next"
                        " fetch", exc)
            self.postbacks_straddled = True
            return False

    async def fenced_wait_next(self: Any, timeout: float) -> Any:  # noqa: ASYNC109 (Faust's signature)
        if getattr(self, "postbacks_straddled", False):
            self.postbacks_straddled = self.postbacks_handing_over = False
            if not await reseek(self, "seek_during_hand_over"):
                await asyncio.sleep(0.5)
                return {}, None
        self.postbacks_handing_over = False
        before = getattr(self, "postbacks_seeks", 0)
        records, active = await wait_next(self, timeout)
        if records and getattr(self, "postbacks_seeks", 0) != before:
            changelogs = self.app.tables.changelog_topics
            kept = {tp: recs for tp, recs in records.items() if tp.topic in changelogs}
            log.info("dropped a fetched batch that a seek overtook (%d records); every "
                     "partition is sought to its committed offset again",
                     sum(len(r) for tp, r in records.items() if tp not in kept))
            await reseek(self, "seek_during_fetch")
            records = kept
        self.postbacks_handing_over = bool(records)
        return records, active

    fns: tuple[Any, ...] = (fenced_wait_next, fenced_perform_seek, fenced_seek, seek_to_committed)
    for fn in fns:
        fn.postbacks_patched = True
    base._wait_next_records = fenced_wait_next
    base.perform_seek = fenced_perform_seek
    base.seek = fenced_seek
    delegate.seek_to_committed = seek_to_committed
