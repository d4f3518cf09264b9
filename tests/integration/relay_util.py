"""The relay run in a thread of the test, against the real broker."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from postbacks.settings import Settings
from streams.relay import run_relay


@contextmanager
def relay_running(settings: Settings, clock: Callable[[], float] = time.time) -> Iterator[None]:
    """Run the relay (on ``clock``) for the block; stop it after, and check it stopped."""
    stop = threading.Event()
    relay = threading.Thread(target=run_relay, args=(settings, stop), kwargs={"clock": clock},
                             daemon=True)
    relay.start()
    try:
        yield
    finally:
        stop.set()
        relay.join(30)
    assert not relay.is_alive(), "the relay did not stop within 30 s"
