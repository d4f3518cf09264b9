"""Modes, thresholds and durable halts from PostgreSQL, re-read every ``anomaly_refresh_s``.

The first read happens before the gate consumes anything and must succeed (a gate that
does not know its modes would either hold nothing or everything): PostgreSQL missing at
start is a clear error and exit 2. Later failures keep the last good view -- a trip is
never forgotten because a read failed. The same pass exports the held-cohort gauges
(depth, and the age of the oldest from ``held_at``).

A pass is one round trip on a connection kept open between passes: PostgreSQL returns the
settings' change counter (``config_versions``, bumped by a trigger in every transaction
writing them) with the held-cohort figures, and the rows are read and the config rebuilt
only when the counter moved. A full read (a new connection, ~1,000 rows,
the config rebuilt) cost ~12 ms of the gate's CPU every 2 s, and in the gate's process
that showed as a 40-80 ms spike in its added latency every pass at 2,000 deliveries/s
(p99 62 ms against 37 ms with the refresh every 600 s, bench/gate.py ``--series``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

import psycopg

from postbacks.db.connect import KeptConnection, connect
from postbacks.metrics import HALTED_SCOPES, HELD_DEPTH, HELD_OLDEST_AGE
from postbacks.settings import Settings
from streams.anomaly_gate.config import GateConfig, HaltBook, StateChange, build_config

__all__ = ["Refresher", "Snapshot"]

log = logging.getLogger(__name__)

Snapshot = tuple[GateConfig, list[StateChange], int, float | None]



def gauge_halts(halts: HaltBook) -> None:
    """``postbacks_anomaly_halted_scopes``: the scopes tripped in this gate's book, by kind.
    Set whenever the book may have changed: a trip of this gate's own, a control record
    (this gate's own trip read back changes nothing in the book), a PostgreSQL refresh."""
    kinds = [s[0] for s in halts.tripped()]
    for kind in ("endpoint", "global"):
        HALTED_SCOPES.labels(kind).set(kinds.count(kind))

class _Target(Protocol):
    config: GateConfig


# The settings' change counter, bumped by a trigger in every transaction writing them (a
# mode, a parameter, a halt state, a row added or deleted; migration 0003), with the
# held-cohort figures in the same round trip. (It replaced an md5 of every settings row,
# 6-10 ms of PostgreSQL per refresh at 1,800 rows.)
_PROBE = (
    "SELECT (SELECT version FROM config_versions"
    "         WHERE name = 'payout_anomaly_settings'),"
    " count(*), extract(epoch FROM min(held_at)) FROM deliveries WHERE status = 'held'"
    " AND hold_reason IS DISTINCT FROM 'endpoint_disabled'"  # parked: not for review
)


def _probe(conn: psycopg.Connection[Any]) -> tuple[int | None, int, float | None]:
    """(settings version, None when its row is missing: read every pass; held depth,
    oldest held_at epoch s)."""
    version, depth, oldest = conn.execute(_PROBE).fetchone() or (None, 0, None)
    return (None if version is None else int(version)), int(depth), (
        None if oldest is None else float(oldest))


def _snapshot(settings: Settings, conn: psycopg.Connection[Any], depth: int,
              oldest: float | None) -> Snapshot:
    from postbacks.db.anomaly import load_rows

    cfg, states = build_config(load_rows(conn), settings.anomaly_global_key)
    return cfg, states, depth, oldest


class Refresher:
    def __init__(self, settings: Settings, first: Snapshot) -> None:
        self.settings = settings
        self._first = first
        self.targets: tuple[_Target, ...] = ()
        self._db = KeptConnection(settings.database_url)
        self._version: int | None = None  # config_versions' value of the rows last applied
        self.loads = 0  # full reads after the first (the counter saved the others)

    @classmethod
    def load(cls, settings: Settings) -> Refresher:
        with connect(settings.database_url) as conn:
            version, depth, oldest = _probe(conn)
            refresher = cls(settings, _snapshot(settings, conn, depth, oldest))
        refresher._version = version
        return refresher

    def apply_initial(self, halts: HaltBook) -> GateConfig:
        cfg, states, depth, oldest = self._first
        for s in states:
            halts.apply(s)
        self._gauges(depth, oldest)
        gauge_halts(halts)
        return cfg

    def _gauges(self, depth: int, oldest: float | None) -> None:
        HELD_DEPTH.set(depth)
        HELD_OLDEST_AGE.set(0.0 if oldest is None else max(0.0, time.time() - oldest))

    def apply(self, snap: Snapshot, halts: HaltBook) -> None:
        cfg, states, depth, oldest = snap
        for t in self.targets:
            t.config = cfg
        for s in states:
            if halts.apply(s):
                log.warning("halt %s %s is now %s (from PostgreSQL)", s.scope, s.detector,
                            s.state.value)
        self._gauges(depth, oldest)
        gauge_halts(halts)

    def read_changed(self) -> Snapshot | tuple[int, float | None]:
        """One pass: the whole snapshot when a settings row changed since the last one
        applied, else only (held depth, oldest held_at). On the kept connection
        (:class:`KeptConnection`: one retry on a new one, then ServiceUnavailable)."""
        return self._db.run(self._read_changed)

    def _read_changed(self, conn: psycopg.Connection[Any]
                      ) -> Snapshot | tuple[int, float | None]:
        version, depth, oldest = _probe(conn)
        if version is not None and version == self._version:
            return depth, oldest
        snap = _snapshot(self.settings, conn, depth, oldest)
        self._version = version
        self.loads += 1
        return snap

    def close(self) -> None:
        self._db.close()

    async def run(self, halts: HaltBook) -> Any:
        failing = False
        while True:
            await asyncio.sleep(self.settings.anomaly_refresh_s)
            try:
                got = await asyncio.to_thread(self.read_changed)
            except Exception as exc:
                if not failing:
                    log.error("reading anomaly settings failed (%s); keeping the last view",
                              exc)
                failing = True
                continue
            if failing:
                log.info("anomaly settings readable again")
            failing = False
            if len(got) == 4:
                self.apply(got, halts)
            else:
                self._gauges(*got)
