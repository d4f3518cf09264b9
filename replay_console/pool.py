"""A few PostgreSQL connections used from worker threads, so a query never blocks the
console's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import psycopg

from postbacks.db.connect import connect

__all__ = ["STATEMENT_TIMEOUT_MS", "ConnPool"]

# A page's query past this is cancelled (503, "narrow it"): a search over months of a big
# table must not hold one of the few connections, and its locks, for minutes.
STATEMENT_TIMEOUT_MS = 60_000

T = TypeVar("T")


class ConnPool:
    """A few PostgreSQL connections used from worker threads, one per call."""

    def __init__(self, database_url: str, size: int = 4,
                 statement_timeout_ms: int = STATEMENT_TIMEOUT_MS) -> None:
        self._url = database_url
        self.statement_timeout_ms = statement_timeout_ms
        self._free: queue.LifoQueue[psycopg.Connection[Any]] = queue.LifoQueue()
        self._sem = threading.BoundedSemaphore(size)
        # threads of its own, one per connection: a call waiting for a connection waits in
        # this pool's queue, not in a thread of asyncio's shared default executor (calls
        # piled up there, and then every other pool's calls waited behind them)
        self._threads = ThreadPoolExecutor(size, thread_name_prefix="console-db")

    def call(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``fn`` in a transaction on a pooled connection (commit if it returns)."""
        with self._sem:
            try:
                conn = self._free.get_nowait()
            except queue.Empty:
                # keepalives: a server gone without a word (a failover) fails the query in
                # ~30 s, not after the kernel's ~15 minutes with a pool slot held
                conn = connect(self._url, kept=True)
                # set here, not as a connection option: that would replace any options
                # the URL gives (a search_path), and PgBouncer refuses it
                conn.execute("SELECT set_config('statement_timeout', %s, false)",
                             (f"{int(self.statement_timeout_ms)}ms",))
                conn.commit()
            ok = False
            try:
                result = fn(conn)
                conn.commit()
                ok = True
                return result
            finally:
                if ok:
                    self._free.put(conn)
                else:
                    with contextlib.suppress(psycopg.Error):
                        conn.rollback()
                    if conn.closed or conn.info.transaction_status != 0:
                        conn.close()
                    else:
                        self._free.put(conn)

    async def run(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._threads, self.call, fn)

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        while True:
            try:
                self._free.get_nowait().close()
            except queue.Empty:
                return
