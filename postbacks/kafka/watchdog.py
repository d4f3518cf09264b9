"""A last line of defence against a Kafka client call that never returns.

librdkafka can block inside a transactional call indefinitely -- seen here:
``send_offsets_to_transaction`` after a broker restart while the consumer's group session
had expired (the call's own timeout did not apply: confluentinc/librdkafka#5456, #5511;
:mod:`postbacks.kafka.txn` abandons such a send after 10 s, and this is the bound behind
it). A
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
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from confluent_kafka import Consumer, TopicPartition

    from postbacks.settings import Settings

    Rebalance = Callable[[Consumer, list[TopicPartition]], None]

__all__ = ["guard", "orphaned", "restart_in_place", "start", "subscribe_watched",
           "watch_membership"]

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


RESTARTS_ENV = "POSTBACKS_RESTARTS_IN_PLACE"  # how many copies came before this one


def restarts_so_far() -> int:
    """How many times this process has restarted in place (0 in a fresh process)."""
    try:
        return max(0, int(os.environ.get(RESTARTS_ENV, "0")))
    except ValueError:
        return 0


def restart_in_place(reason: str, *, dump: bool = False, backoff_s: float = 0.0) -> None:
    """Replace this process with a fresh copy of itself (same PID and arguments); the copy
    counts it in ``postbacks_restarts_in_place_total`` (a supervisor sees no restart)."""
    log.critical("%s: restarting in place", reason)
    os.environ[RESTARTS_ENV] = str(restarts_so_far() + 1)
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


def orphaned(unassigned_s: float | None, members: int | None, stall_s: float) -> bool:
    """Whether a consumer has fallen out of its group for good: it has held no partition
    for longer than ``stall_s`` and the broker shows its group with no member at all. An
    idle extra instance is a member (with no partition); ``members`` None (the broker could
    not be asked) is no evidence."""
    return unassigned_s is not None and unassigned_s > stall_s and members == 0


def _restart_orphaned(reason: str) -> None:
    restart_in_place(reason, dump=True)


def watch_membership(bootstrap: str, group: str, assigned: Callable[[], bool],
                     stall_s: float, stop: threading.Event,
                     on_orphaned: Callable[[str], None] = _restart_orphaned) -> None:
    """Restart the process in place when its consumer is :func:`orphaned`.

    Seen after a broker restart: the sink's consumer timed out of its group session,
    revoked its partitions, and never joined again -- no JoinGroup reached the broker for
    5 minutes, the group stood empty, and nothing was written meanwhile. ``assigned`` is
    read from this thread: give it a flag the consumer's rebalance callbacks set.
    ``on_orphaned`` (tests) replaces the restart."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "postbacks-admin"})

    def members() -> int | None:
        try:
            fut = admin.describe_consumer_groups([group], request_timeout=5)[group]
            desc: Any = fut.result(timeout=10)  # a ConsumerGroupDescription (stubs say dict)
            return len(desc.members)
        except Exception as exc:  # the broker down or restarting: ask again later
            log.debug("group %s: not described (%s)", group, exc)
            return None

    def loop() -> None:
        since: float | None = None
        while not stop.wait(min(5.0, stall_s / 4)):
            if assigned():
                since = None
                continue
            now = time.monotonic()
            since = now if since is None else since
            if now - since > stall_s and orphaned(now - since, members(), stall_s):
                on_orphaned(f"{group}: no partition for {now - since:.0f} s and the group "
                            "has no member (the consumer never rejoined)")
                since = None

    threading.Thread(target=loop, name="group-watch", daemon=True).start()


def _unpause(c: Consumer, partitions: list[TopicPartition]) -> None:
    from confluent_kafka import KafkaException

    if not partitions:
        return
    try:
        c.resume(partitions)
    except KafkaException as exc:  # a partition already gone: nothing of it is paused here
        log.warning("resuming revoked partitions: %s", exc)


def subscribe_watched(consumer: Consumer, topics: list[str], settings: Settings, group: str,
                      stop: threading.Event, *, on_assign: Rebalance | None = None,
                      on_revoke: Rebalance | None = None,
                      on_orphaned: Callable[[str], None] = _restart_orphaned,
                      offsets_in_kafka: bool = True,
                      ) -> Callable[[], bool]:
    """``consumer.subscribe(topics)`` with :func:`watch_membership` on it, for a consumer
    made by ``make_consumer(settings, group)`` (the same ``group``: the watch asks the
    broker about ``settings.topic(group)``, the group id that made). The rebalance
    callbacks (``on_assign``; ``on_revoke`` for a revocation or a loss; either may be None)
    are wrapped to keep the flag the watch reads, which is returned (tests), and to resume
    every revoked partition: librdkafka keeps a partition's pause across a revocation and a
    later assignment, so a partition paused when it was lost came back paused, with nothing
    left in the stage to resume it (the relay's deliveries waited forever after a broker
    kill; tests/integration/test_relay_rebalance.py).

    For eager assignment, as every consumer here uses (the default ``range,roundrobin``,
    or the sink's ``range``): each assignment is the whole of it and each revocation takes
    everything. The client assigns after ``on_assign`` returns (or raises) unless it
    assigned itself, so the flag is set either way. Each assignment is checked for records
    retention deleted before the group read them (:mod:`postbacks.kafka.expired`), from the
    committed offsets unless ``offsets_in_kafka`` is False."""
    owned = [False]

    def assigned(c: Consumer, partitions: list[TopicPartition]) -> None:
        try:
            if offsets_in_kafka:  # (a consumer keeping its own checks them itself)
                from postbacks.kafka.expired import check_expired

                check_expired(c, settings.topic(group), partitions)
            if on_assign is not None:
                on_assign(c, partitions)
        finally:
            owned[0] = bool(partitions)

    def revoked(c: Consumer, partitions: list[TopicPartition]) -> None:
        owned[0] = False
        try:
            if on_revoke is not None:
                on_revoke(c, partitions)
        finally:
            _unpause(c, partitions)

    consumer.subscribe(topics, on_assign=assigned, on_revoke=revoked, on_lost=revoked)
    watch_membership(settings.kafka_bootstrap_servers, settings.topic(group),
                     lambda: owned[0], settings.stall_restart_s, stop,
                     on_orphaned=on_orphaned)
    return lambda: owned[0]
