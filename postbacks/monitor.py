"""``postbacks monitor``: how far behind every stage is, and what has gone quiet.

Every ``monitor_interval_s`` it reads each stage group's progress (committed offsets, or
the sink's stored ones, against the log ends; :mod:`postbacks.kafka.lag`) and the gap
detector's count (:mod:`postbacks.db.gaps`), and sets:

- ``postbacks_consumer_lag_records{group,topic,partition}``;
- ``webhook_backlog_age_seconds{group,topic}``: the age of the oldest record not yet
  finished (on the delay topics, since it fell due), which grows while a stage is stalled
  or down -- measured from outside the stage, so a stage that cannot run cannot hide it;
- ``webhook_gap_deliveries`` and ``webhook_gap_oldest_age_seconds``;
- ``postbacks_retention_overdue_seconds{table}``: how long (in whole days) the oldest daily
  partition of ``delivery_attempts`` and ``deliveries`` is past the retention window, which
  stays at most a day while ``postbacks retention`` runs daily and grows when it stops or
  keeps failing;
- ``postbacks_partitions_ahead_seconds{table}``: how far ahead of today (whole days) the
  newest daily partition reaches; the sink and the retention job keep it at 6 days;
- ``postbacks_monitor_last_success_timestamp_seconds{check}`` per check (``kafka``,
  ``gaps``, ``disable``, ``retention``; the monitor's start until the first success), and
  ``postbacks_monitor_errors_total{check}`` when one fails: a check that fails leaves its
  last values and the alert on the timestamp's age fires.

Run one monitor per deployment (it only reads; two are harmless).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable

from postbacks.core.backlog import PartitionProgress, backlog_ages, deleted_unread, lag_of
from postbacks.core.endpoint_health import disable_reason
from postbacks.db.connect import connect
from postbacks.db.endpoint_health import candidates, disable
from postbacks.db.gaps import gap_summary, stored_offsets
from postbacks.db.retention import day_partitions, overdue_days
from postbacks.errors import ServiceUnavailable
from postbacks.kafka.lag import ProgressReader
from postbacks.kafka.operations import OperationalEvents
from postbacks.metrics import (
    BACKLOG_AGE,
    CONSUMER_LAG,
    DATABASE_UP,
    DELETED_UNREAD,
    ENDPOINTS_DISABLED,
    GAP_DELIVERIES,
    GAP_OLDEST_AGE,
    MONITOR_ERRORS,
    MONITOR_LAST_SUCCESS,
    PARTITIONS_AHEAD,
    QUARANTINED_DEPTH,
    RETENTION_OVERDUE,
)
from postbacks.settings import Settings
from topics.registry import GROUPS

__all__ = ["Monitor", "run_monitor"]

log = logging.getLogger(__name__)

_CHECKS = ("kafka", "gaps", "quarantine", "disable", "retention")
_QUARANTINED_MAX = 100_000  # counted up to (the alert's threshold is 1,000)
_RETAINED = ("delivery_attempts", "deliveries")  # the daily-partitioned tables


class Monitor:
    """One round at a time (:meth:`tick`); the label sets it set last round are kept so a
    partition or topic that went away stops being exported."""

    def __init__(self, settings: Settings, reader: ProgressReader,
                 clock: Callable[[], float] = time.time,
                 events: OperationalEvents | None = None) -> None:
        self.settings = settings
        self.reader = reader
        self.events = events or OperationalEvents(settings)
        self.clock = clock
        self._lag_labels: set[tuple[str, str, str]] = set()
        self._age_labels: set[tuple[str, str]] = set()
        self._deleted_labels: set[tuple[str, str]] = set()
        self._deleted: dict[tuple[str, str], int] = {}
        # Until a check first succeeds its "last success" is the monitor's start, so a
        # check that never succeeds still goes stale (PostbacksMonitorStale).
        for check in _CHECKS:
            MONITOR_LAST_SUCCESS.labels(check).set(clock())

    def tick(self) -> None:
        self._check("kafka", self._kafka)
        self._check("gaps", self._gaps)
        self._check("quarantine", self._quarantine)
        self._check("disable", self._disable)
        self._check("retention", self._retention)

    def _check(self, name: str, run: Callable[[], None]) -> None:
        """Run one check; whatever it raises is counted and logged, never fatal: a monitor
        that died of a broker or database fault would hide the fault it should show."""
        try:
            run()
        except ServiceUnavailable as exc:
            MONITOR_ERRORS.labels(name).inc()
            log.warning("monitor: %s check failed: %s", name, exc)
            return
        except Exception:
            MONITOR_ERRORS.labels(name).inc()
            log.exception("monitor: %s check failed", name)
            return
        MONITOR_LAST_SUCCESS.labels(name).set(self.clock())

    def _kafka(self) -> None:
        stored: dict[tuple[str, str, int], int] | None
        try:
            with connect(self.settings.database_url) as conn:
                stored = stored_offsets(conn)
        except Exception as exc:  # PostgreSQL down: measure the groups kept in Kafka
            log.warning("monitor: the sink's offsets are unreadable (%s); its group is left "
                        "out of this round", exc)
            stored = None
        DATABASE_UP.set(0 if stored is None else 1)
        parts = self.reader.read(stored)
        self.publish(parts, int(self.clock() * 1000))
        if stored is None:
            raise ServiceUnavailable("the sink's offsets were unreadable: its lag is not measured")

    def publish(self, parts: list[PartitionProgress], now_ms: int) -> None:
        """Export one round. A group left out of the round (its offsets unreadable) keeps
        its last values; a partition or topic gone from a measured group is removed."""
        measured = {p.group for p in parts}
        lags = {(p.group, p.topic, str(p.partition)): lag_of(p) for p in parts}
        for key in {k for k in self._lag_labels - lags.keys() if k[0] in measured}:
            CONSUMER_LAG.remove(*key)
            self._lag_labels.discard(key)
        for key, value in lags.items():
            CONSUMER_LAG.labels(*key).set(value)
        self._lag_labels |= set(lags)
        ages = backlog_ages(parts, now_ms)
        for gone in {k for k in self._age_labels - ages.keys() if k[0] in measured}:
            BACKLOG_AGE.remove(*gone)
            self._age_labels.discard(gone)
        for group_topic, age in ages.items():
            BACKLOG_AGE.labels(*group_topic).set(age)
        self._age_labels |= set(ages)
        deleted = deleted_unread(parts)
        for gone in {k for k in self._deleted_labels - deleted.keys() if k[0] in measured}:
            DELETED_UNREAD.remove(*gone)
            self._deleted_labels.discard(gone)
        for (group, topic), n in deleted.items():
            if n and n != self._deleted.get((group, topic)):  # logged as it grows
                log.error("monitor: %s: %d record(s) of %s deleted by retention past the "
                          "group's committed offset: it never read them", group, n, topic)
            self._deleted[(group, topic)] = n
            DELETED_UNREAD.labels(group, topic).set(n)
        self._deleted_labels |= set(deleted)

    def _disable(self) -> None:
        """Auto-disable (seed 003): endpoints that have only failed for
        ``auto_disable_after_s``, or answered 410 Gone under ``disable_on_gone``; each
        disabled once, audited, and told on operations.v1."""
        now_ms = int(self.clock() * 1000)
        with connect(self.settings.database_url) as conn:
            for c in candidates(conn):
                reason = disable_reason(c.health, now_ms=now_ms, disable_on_gone=c.disable_on_gone,
                                        after_s=self.settings.auto_disable_after_s)
                if reason is not None and disable(conn, c.endpoint_id, reason):
                    log.warning("monitor: endpoint %s disabled: %s", c.endpoint_id, reason)
                    self.events.publish("endpoint.disabled", c.endpoint_id, c.app_id, reason,
                                        now_ms)
            row = conn.execute("SELECT count(*) FROM endpoints"
                               " WHERE enabled AND disabled_at IS NOT NULL").fetchone()
        ENDPOINTS_DISABLED.set(int(row[0]) if row else 0)

    def _gaps(self) -> None:
        now = dt.datetime.fromtimestamp(self.clock(), dt.UTC)
        with connect(self.settings.database_url) as conn:
            count, oldest = gap_summary(conn, now=now, older_than_s=self.settings.gap_after_s)
        GAP_DELIVERIES.set(count)
        GAP_OLDEST_AGE.set(oldest)

    def _quarantine(self) -> None:
        """Deliveries whose status is quarantined, wherever they wait (a divert due over a
        minute ahead waits in a retry tier, not in quarantine.v1)."""
        with connect(self.settings.database_url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM (SELECT 1 FROM deliveries WHERE status = 'quarantined'"
                " LIMIT %s) q", (_QUARANTINED_MAX,)).fetchone()
        QUARANTINED_DEPTH.set(int(row[0]) if row else 0)

    def _retention(self) -> None:
        today = dt.datetime.fromtimestamp(self.clock(), dt.UTC).date()
        with connect(self.settings.database_url) as conn:
            for table in _RETAINED:
                days = day_partitions(conn, table)
                RETENTION_OVERDUE.labels(table).set(86_400 * overdue_days(
                    days, today, self.settings.attempt_retention_days))
                # no partition at all: as far behind as "none since yesterday"
                newest = days[-1][1] if days else today - dt.timedelta(days=1)
                PARTITIONS_AHEAD.labels(table).set(86_400 * (newest - today).days)


def run_monitor(settings: Settings, stop: threading.Event) -> None:
    reader = ProgressReader(settings, GROUPS)
    monitor = Monitor(settings, reader)
    log.info("monitor: every %.0f s, gaps after %.0f s", settings.monitor_interval_s,
             settings.gap_after_s)
    try:
        while not stop.is_set():
            started = time.monotonic()
            monitor.tick()
            stop.wait(max(0.0, settings.monitor_interval_s - (time.monotonic() - started)))
    finally:
        reader.close()
