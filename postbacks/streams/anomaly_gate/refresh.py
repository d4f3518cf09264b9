"""Modes, thresholds and durable halts from PostgreSQL, re-read every ``anomaly_refresh_s``.

The first read happens before the gate consumes anything and must succeed (a gate that
does not know its modes would either hold nothing or everything): PostgreSQL missing at
start is a clear error and exit 2. Later failures keep the last good view -- a trip is
never forgotten because a read failed. The same pass exports the held-cohort gauges
(depth, and the age of the oldest from ``held_at``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from postbacks.db.connect import connect
from postbacks.metrics import HELD_DEPTH, HELD_OLDEST_AGE
from postbacks.settings import Settings
from postbacks.streams.anomaly_gate.config import GateConfig, HaltBook, StateChange, build_config

__all__ = ["Refresher", "Snapshot"]

log = logging.getLogger(__name__)

Snapshot = tuple[GateConfig, list[StateChange], int, float | None]


class _Target(Protocol):
    config: GateConfig


def read_snapshot(settings: Settings) -> Snapshot:
    """(config, halt states, held depth, oldest held_at epoch s) from PostgreSQL."""
    from postbacks.db.anomaly import load_rows

    with connect(settings.database_url) as conn:
        rows = load_rows(conn)
        depth, oldest = conn.execute(
            "SELECT count(*), extract(epoch FROM min(held_at)) FROM deliveries"
            " WHERE status = 'held'"
        ).fetchone() or (0, None)
    cfg, states = build_config(rows, settings.anomaly_global_key)
    return cfg, states, int(depth), None if oldest is None else float(oldest)


class Refresher:
    def __init__(self, settings: Settings, first: Snapshot) -> None:
        self.settings = settings
        self._first = first
        self.targets: tuple[_Target, ...] = ()

    @classmethod
    def load(cls, settings: Settings) -> Refresher:
        return cls(settings, read_snapshot(settings))

    def apply_initial(self, halts: HaltBook) -> GateConfig:
        cfg, states, depth, oldest = self._first
        for s in states:
            halts.apply(s)
        self._gauges(depth, oldest)
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

    async def run(self, halts: HaltBook) -> Any:
        failing = False
        while True:
            await asyncio.sleep(self.settings.anomaly_refresh_s)
            try:
                snap = await asyncio.to_thread(read_snapshot, self.settings)
            except Exception as exc:
                if not failing:
                    log.error("reading anomaly settings failed (%s); keeping the last view",
                              exc)
                failing = True
                continue
            if failing:
                log.info("anomaly settings readable again")
            failing = False
            self.apply(snap, halts)
