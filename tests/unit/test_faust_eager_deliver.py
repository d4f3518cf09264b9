"""The gate's eager ``wait_first`` for Faust's fetch loop (streams/anomaly_gate/faust_patches):
the same results as mode's, with the callback run at once when it does not suspend, and
handed to mode's own ``wait_first`` with the suspended flow when it does."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from faust.transport.consumer import Consumer as FaustConsumer

from streams.anomaly_gate.faust_patches import continue_coroutine, patch_faust_eager_deliver


class FakeConsumer:
    """What the patched method reads of a Faust consumer, with mode's wait_first beside."""

    def __init__(self) -> None:
        self.suspend_flow = asyncio.Event()
        self.original_calls = 0

    async def original(self, *coros: Any, timeout: Any = None) -> Any:  # noqa: ASYNC109
        self.original_calls += 1
        tasks = [asyncio.ensure_future(c) for c in coros]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED,
                                           timeout=timeout)
        for t in pending:
            t.cancel()
        return [t.result() for t in done]


@pytest.fixture()
def wait_first(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The patched wait_first, over a stand-in for mode's (counted)."""
    fake_original: Any = None

    async def original(self: FakeConsumer, *coros: Any,
                       timeout: Any = None) -> Any:  # noqa: ASYNC109
        return await self.original(*coros, timeout=timeout)

    monkeypatch.setattr(FaustConsumer, "wait_first", original)
    fake_original = FaustConsumer.wait_first
    patch_faust_eager_deliver()
    patched = FaustConsumer.wait_first
    assert patched is not fake_original and patched.postbacks_patched  # type: ignore[attr-defined]
    patch_faust_eager_deliver()  # once only
    assert FaustConsumer.wait_first is patched
    return patched


def test_a_callback_that_does_not_suspend_runs_at_once_without_tasks(wait_first: Any) -> None:
    async def main() -> None:
        c = FakeConsumer()
        got: list[int] = []

        async def callback(m: int) -> int:
            got.append(m)
            return m * 2

        before = len(asyncio.all_tasks())
        res = await wait_first(c, callback(21), c.suspend_flow.wait())
        assert got == [21] and res.results == [42] and res.stopped is False
        assert c.original_calls == 0 and len(asyncio.all_tasks()) == before

    asyncio.run(main())


def test_a_callback_that_suspends_finishes_through_the_original_wait(wait_first: Any) -> None:
    async def main() -> None:
        c = FakeConsumer()
        q: asyncio.Queue[int] = asyncio.Queue(maxsize=1)
        q.put_nowait(0)  # full: put() suspends

        async def callback(m: int) -> str:
            await q.put(m)
            await asyncio.sleep(0)
            return "queued"

        async def drain() -> None:
            await asyncio.sleep(0.01)
            assert q.get_nowait() == 0

        asyncio.get_running_loop().create_task(drain())
        res = await wait_first(c, callback(7), c.suspend_flow.wait())
        assert res == ["queued"] and c.original_calls == 1
        assert q.get_nowait() == 7

    asyncio.run(main())


def test_a_suspended_flow_gives_up_on_a_blocked_callback_as_before(wait_first: Any) -> None:
    async def main() -> None:
        c = FakeConsumer()
        q: asyncio.Queue[int] = asyncio.Queue(maxsize=1)
        q.put_nowait(0)
        cancelled = asyncio.Event()

        async def callback(m: int) -> None:
            try:
                await q.put(m)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        asyncio.get_running_loop().call_later(0.01, c.suspend_flow.set)
        res = await wait_first(c, callback(7), c.suspend_flow.wait())
        assert res == [True]  # the flow's wait won
        await asyncio.wait_for(cancelled.wait(), 1)  # the callback was cancelled inside
        assert q.qsize() == 1 and q.get_nowait() == 0

    asyncio.run(main())


def test_with_the_flow_already_suspended_or_other_arguments_the_original_runs(
        wait_first: Any) -> None:
    async def main() -> None:
        c = FakeConsumer()

        async def callback() -> int:
            return 1

        c.suspend_flow.set()
        assert await wait_first(c, callback(), c.suspend_flow.wait()) in ([1, True], [True, 1])
        c.suspend_flow.clear()
        assert await wait_first(c, callback(), timeout=1.0) == [1]
        ev = asyncio.Event()
        ev.set()
        assert await wait_first(c, callback(), ev.wait(), timeout=1.0) in ([1, True], [True, 1])
        assert c.original_calls == 3

    asyncio.run(main())


def test_an_exception_from_the_callback_propagates_either_way(wait_first: Any) -> None:
    async def main() -> None:
        c = FakeConsumer()

        async def at_once() -> None:
            raise ValueError("bad record")

        async def later() -> None:
            await asyncio.sleep(0.001)
            raise KeyError("later")

        with pytest.raises(ValueError, match="bad record"):
            await wait_first(c, at_once(), c.suspend_flow.wait())
        with pytest.raises(KeyError):
            await wait_first(c, later(), c.suspend_flow.wait())

    asyncio.run(main())


def test_continue_coroutine_passes_results_exceptions_and_cancellation_on() -> None:
    async def main() -> None:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def inner() -> int:
            got = await fut
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                return got + 1000
            return got

        coro = inner()
        yielded = coro.send(None)
        assert yielded is fut
        task = asyncio.ensure_future(continue_coroutine(coro, yielded))
        await asyncio.sleep(0)
        fut.set_result(5)
        await asyncio.sleep(0.01)
        task.cancel()  # thrown into inner, which returns
        assert await task == 1005

        bad: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def raises() -> int:
            return await bad

        coro2 = raises()
        t2 = asyncio.ensure_future(continue_coroutine(coro2, coro2.send(None)))
        await asyncio.sleep(0)
        bad.set_exception(OSError("gone"))
        with pytest.raises(OSError, match="gone"):
            await t2

    asyncio.run(main())


def test_through_modes_own_wait_first_on_a_service() -> None:
    """The patch as installed in the gate: over mode's real ``wait_first``."""
    from mode import Service

    patch_faust_eager_deliver()
    patched = FaustConsumer.wait_first

    class Svc(Service):
        pass

    async def main() -> None:
        svc = Svc()
        svc.suspend_flow = asyncio.Event()  # type: ignore[attr-defined]
        q: asyncio.Queue[int] = asyncio.Queue(maxsize=1)

        async def callback(m: int) -> int:
            await q.put(m)
            return m

        res = await patched(svc, callback(1), svc.suspend_flow.wait())  # type: ignore[attr-defined]
        assert res.results == [1] and not res.stopped
        asyncio.get_running_loop().call_later(0.01, q.get_nowait)
        res = await patched(svc, callback(2), svc.suspend_flow.wait())  # type: ignore[attr-defined]
        assert res.results == [2] and not res.stopped  # suspended on the full queue, then in
        assert q.get_nowait() == 2

    asyncio.run(main())
