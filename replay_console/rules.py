"""What every console action shares: the refusal it raises, the rights check, the audit row.

:class:`ActionError` carries the HTTP status the API answers with; :func:`audit` writes one
``audit_log`` row (actor, action, target, before/after, note) in the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from replay_console.auth import Principal, may

__all__ = ["ActionError", "Lookup", "audit", "require"]

Lookup = Callable[[str], list[str]]  # host -> addresses (the DNS seam; blocking)


class ActionError(Exception):
    """A refused action: nothing changed. ``status`` is the HTTP status the API answers."""

    def __init__(self, message: str, status: int = 400, *, audit: bool = False,
                 **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.audit = audit  # audited as a refusal, as every 403 and 429 is
        self.extra = extra


def require(p: Principal, right: str, what: str) -> None:
    if not may(p, right):
        raise ActionError(f"a {p.role} may not {what}", 403)


def audit(conn: psycopg.Connection[Any], p: Principal, action: str, target_type: str,
           target_id: str, before: Any, after: Any, note: str | None = None) -> None:
    conn.execute(
        "INSERT INTO audit_log (actor, action, target_type, target_id, before, after, note)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s)",
        (p.actor, action, target_type, target_id,
         None if before is None else Jsonb(before), None if after is None else Jsonb(after),
         note),
    )
