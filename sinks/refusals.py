"""What PostgreSQL refuses in a sink row, named by column: a NUL character in a text or
jsonb value, and a text too long for a btree index. The stages never produce either (the
fan-out checks what enters); a record from another producer can. The sink checks every row
of a batch PostgreSQL refused (:func:`row_problems`), and on every row the few columns it
copies into another table's index later (:func:`feed_problem`), where a refusal would come
after the row itself was stored. Pure, apart from :func:`indexed_columns`."""

from __future__ import annotations

from typing import Any

import psycopg

from sinks.tables import TABLES

__all__ = ["INDEXED_TEXT_MAX", "feed_problem", "indexed_columns", "intent_problem",
           "row_problems"]

# An indexed text value's bytes at most: a btree entry holds at most about 2,700 bytes, and
# the widest index has three text columns. The stages' ids are at most 200 characters.
INDEXED_TEXT_MAX = 800
# Columns whose value the sink copies into an indexed column of another table, later or by
# statement: the status projection (attempts.error_class -> deliveries.last_error,
# outcomes.kind -> deliveries.status), endpoint health (attempts.endpoint_id), suppressions
# (outcomes.endpoint_id).
_FEEDS_INDEX = {
    name: tuple((TABLES[name].columns.index(c), c) for c in cols)
    for name, cols in (("attempts", ("endpoint_id", "error_class")),
                       ("outcomes", ("endpoint_id", "kind")))}
_INDEXED_SQL = (
    "SELECT DISTINCT a.attname::text FROM pg_index i JOIN pg_attribute a"
    " ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey::int2[])"
    " WHERE i.indrelid = %s::regclass")


def indexed_columns(conn: psycopg.Connection[Any]) -> dict[str, frozenset[str]]:
    """Per sink table, the names of its columns in any index (from the catalog)."""
    return {t.name: frozenset(r[0] for r in conn.execute(_INDEXED_SQL, (t.target,)))
            for t in TABLES.values()}


def _nul_in(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_nul_in(k) or _nul_in(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_nul_in(v) for v in value)
    return False


def _over(value: Any) -> int | None:
    """The UTF-8 length of a text over :data:`INDEXED_TEXT_MAX` bytes, else None (cheap for
    a short one: a character takes at most 4 bytes)."""
    if not isinstance(value, str) or len(value) <= INDEXED_TEXT_MAX // 4:
        return None
    n = len(value.encode(errors="replace"))
    return n if n > INDEXED_TEXT_MAX else None


def row_problems(columns: tuple[str, ...], row: tuple[Any, ...],
                 indexed: frozenset[str]) -> list[str]:
    """What PostgreSQL would refuse in ``row`` (``columns``' values): a NUL character in
    any text or jsonb value (a key of it included), and a text value of an ``indexed``
    column over :data:`INDEXED_TEXT_MAX` bytes in UTF-8."""
    problems: list[str] = []
    for name, value in zip(columns, row, strict=True):
        if _nul_in(value):
            problems.append(f"{name} holds a NUL character")
        elif name in indexed and (n := _over(value)) is not None:
            problems.append(f"{name} is {n:,} bytes, over the {INDEXED_TEXT_MAX} its index"
                            " takes")
    return problems


def feed_problem(table: str, row: tuple[Any, ...]) -> str | None:
    """A column of ``table``'s ``row`` too long for the index the sink copies it into."""
    for i, column in _FEEDS_INDEX.get(table, ()):
        if (n := _over(row[i])) is not None:
            return (f"{column} is {n:,} bytes, over the {INDEXED_TEXT_MAX} the index it is"
                    " copied into takes")
    return None


def intent_problem(table: str, value: Any) -> str | None:
    """What PostgreSQL would refuse in an attempt intent's row and the attempt row does not
    hold (so :func:`row_problems` never sees it): its ``agent_instance``. Intents are not
    written row by row, so a refused one stalled the sink (every restart failed on it)."""
    instance = value.get("agent_instance") if table == "attempts" else None
    if isinstance(instance, str) and ("\x00" in instance or len(instance) > INDEXED_TEXT_MAX):
        return f"agent_instance holds a NUL character or is over {INDEXED_TEXT_MAX} characters"
    return None
