"""The sink's check of a row PostgreSQL refused a batch for (sinks.refusals.row_problems);
the refusal itself, through Kafka and PostgreSQL, is tests/integration/test_sink_refused.py."""

from __future__ import annotations

from typing import Any

import pytest

from sinks.refusals import INDEXED_TEXT_MAX, feed_problem, row_problems

COLUMNS = ("id", "note", "doc", "raw", "n")
INDEXED = frozenset({"id"})


@pytest.mark.parametrize(("row", "named"), [
    (("a" * INDEXED_TEXT_MAX, "x" * 10_000, {"k": ["v"]}, b"\x00", 1), []),  # at the limits
    (("é" * (INDEXED_TEXT_MAX // 2), None, None, None, None), []),
    (("a" * (INDEXED_TEXT_MAX + 1), None, None, None, None), ["id is 801 bytes"]),
    (("é" * (INDEXED_TEXT_MAX // 2 + 1), None, None, None, None), ["id is 802 bytes"]),
    (("a\x00", None, None, None, None), ["id holds a NUL"]),
    (("a", "n\x00", None, None, None), ["note holds a NUL"]),
    (("a", None, {"k": {"deep": ["x", "y\x00"]}}, None, None), ["doc holds a NUL"]),
    (("a", None, {"k\x00": 1}, None, None), ["doc holds a NUL"]),
    (("a\x00" * 500, "\x00", None, None, None), ["id holds a NUL", "note holds a NUL"]),
    (("a", "\udcff", None, None, None), []),  # a lone surrogate: not this check's
])
def test_what_postgresql_refuses_is_named_by_column(row: tuple[Any, ...],
                                                    named: list[str]) -> None:
    problems = row_problems(COLUMNS, row, INDEXED)
    assert len(problems) == len(named)
    for problem, words in zip(problems, named, strict=True):
        assert problem.startswith(words), problems


@pytest.mark.parametrize(("table", "column", "length", "named"), [
    ("attempts", "error_class", INDEXED_TEXT_MAX, None),
    ("attempts", "error_class", INDEXED_TEXT_MAX + 1, "error_class is 801 bytes"),
    ("outcomes", "kind", 3000, "kind is 3,000 bytes"),
    ("outcomes", "endpoint_id", 900, "endpoint_id is 900 bytes"),
    ("outcomes", "reason", 3000, None),  # copied nowhere indexed
])
def test_a_column_copied_into_another_index_is_checked_on_every_row(
        table: str, column: str, length: int, named: str | None) -> None:
    from sinks.tables import TABLES

    columns = TABLES[table].columns
    row = tuple("x" * length if c == column else None for c in columns)
    got = feed_problem(table, row)
    assert (got is None) if named is None else (got or "").startswith(named), got
