"""A last line of defence against a Kafka client call that never returns.

librdkafka can block inside a transactional call indefinitely -- seen here:
``send_offsets_to_transaction`` after a broker restart while the consumer's group session
had expired (the call's own timeout did not apply: confluentinc/librdkafka#5456, #5511). A
stage stuck like that holds its partitions forever. The watchdog notices a guarded call
running longer than its limit (its own, or ``stall_s``), dumps every thread's stack to the
log, and re-executes the process in place (same PID, same arguments). That is safe by
construction: nothing was committed, the new process's transactional producer fences the
old one, and consumption resumes from the committed offsets. A fatal client error (the
transactional producer is unusable) is handled the same way by the stage runner, after a
short back-off.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator

__all__ = ["guard", "restart_in_place", "start"]

log = logging.getLogger(__name__)

_busy: dict[int, tuple[str, float, float | None]] = {}  # thread -> (what, since, limit)
_lock = threading.Lock()


@contextlib.contextmanager
def guard(what: str, limit_s: float | None = None) -> Iterator[None]:
    """Mark a blocking Kafka call; the watchdog restarts the process if it has not returned
    after ``limit_s`` (default: the watchdog's ``stall_s``). Guards nest: an inner one
    stands for its thread until it ends, then the outer one is back, its time unchanged."""
    key = threading.get_ident()
    with _lock:
        outer = _busy.get(key)
        _busy[key] = (what, time.monotonic(), limit_s)
    try:
        yield
    finally:
        with _lock:
            if outer is None:
                _busy.pop(key, None)
            else:
                _busy[key] = outer


def restart_in_place(reason: str, *, dump: bool = False, backoff_s: float = 0.0) -> None:
    """Replace this process with a fresh copy of itself (same PID and arguments)."""
    log.critical("%s: restarting in place", reason)
    if dump:
        faulthandler.dump_traceback(all_threads=True)
    for handler in logging.getLogger().handlers:
        handler.flush()
    time.sleep(backoff_s)
    os.execv(sys.executable, [sys.executable, "-m", "postbacks", *sys.argv[1:]])


def _restart(what: str, seconds: float) -> None:
    restart_in_place(f"{what} has not returned for {seconds:.0f} s (stacks follow)", dump=True)


def overdue(stall_s: float, now: float | None = None) -> list[tuple[str, float]]:
    """The guarded calls running past their limit: (what, seconds)."""
    now = time.monotonic() if now is None else now
    with _lock:
        return [(w, now - t) for w, t, limit in _busy.values()
                if now - t > (stall_s if limit is None else limit)]


def start(stall_s: float, stop: threading.Event) -> None:
    def loop() -> None:
        while not stop.wait(min(5.0, stall_s / 4)):
            stuck = overdue(stall_s)
            if stuck:
                _restart(*stuck[0])

    threading.Thread(target=loop, name="kafka-watchdog", daemon=True).start()
