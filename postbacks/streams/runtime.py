"""What every stage process does around its loop: logging, metrics, signals, fail-fast."""

from __future__ import annotations

import faulthandler
import logging
import signal
import threading
from types import FrameType

from postbacks.kafka import watchdog
from postbacks.metrics import serve_metrics
from postbacks.settings import Settings

__all__ = ["setup_process"]


def setup_process(name: str, settings: Settings) -> threading.Event:
    """Configure logging, serve /metrics, and return an event set on SIGTERM/SIGINT."""
    logging.basicConfig(
        level=settings.log_level.upper(),
        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
    )
    stop = threading.Event()

    def _handler(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger(name).info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, _handler)
    signal.signal(signal.SIGINT, _handler)
    # `kill -USR1 <pid>` writes every thread's stack to the log: how to see a stuck stage.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    watchdog.start(settings.stall_restart_s, stop)
    serve_metrics(settings.metrics_port)
    return stop
