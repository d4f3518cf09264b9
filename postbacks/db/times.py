"""Epoch milliseconds (the records' and the core's time) <-> PostgreSQL's timestamptz."""

from __future__ import annotations

import datetime as dt
from typing import overload

__all__ = ["ms_of", "ts_of"]


def ms_of(t: dt.datetime | None) -> int | None:
    """A timestamptz as epoch ms (None stays None)."""
    return None if t is None else int(t.timestamp() * 1000)


@overload
def ts_of(ms: int) -> dt.datetime: ...
@overload
def ts_of(ms: None) -> None: ...
@overload
def ts_of(ms: int | None) -> dt.datetime | None: ...
def ts_of(ms: int | None) -> dt.datetime | None:
    """Epoch ms as an aware UTC datetime (None stays None)."""
    return None if ms is None else dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
