"""Whether a record's fields have the types its Avro schema gives them. Pure.

The producer helper checks an event before encoding it: a ``None`` inside
``source_snapshot`` (a database row's NULL), a float payout or a number where an id
belongs used to fail with a ``TypeError`` from deep inside a check, or a
``cannot encode`` naming no field. This names each field and what it holds.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

__all__ = ["type_problems"]

_LONG = (-(2**63), 2**63)
_INT = (-(2**31), 2**31)
_NAMES = {"string": "a string", "long": "a whole number within 64 bits",
          "int": "a whole number within 32 bits",
          "boolean": "true or false", "double": "a number", "float": "a number",
          "bytes": "bytes"}


def _fits(value: Any, avro: Any) -> bool:
    if isinstance(avro, list):
        return any(_fits(value, t) for t in avro)
    if isinstance(avro, dict):
        if avro.get("type") == "map":
            return isinstance(value, Mapping) and all(
                isinstance(k, str) and _fits(v, avro["values"]) for k, v in value.items())
        if avro.get("type") == "array":
            return isinstance(value, list) and all(_fits(v, avro["items"]) for v in value)
        return True  # (a record, an enum or a fixed: the encoder's to judge)
    if avro == "null":
        return value is None
    if avro in ("long", "int"):  # (any integer type: a numpy integer too, not a bool)
        low, high = _LONG if avro == "long" else _INT
        if isinstance(value, bool) or not hasattr(type(value), "__index__"):
            return False
        return low <= operator.index(value) < high
    if avro == "string":
        return isinstance(value, str)
    if avro == "boolean":
        return isinstance(value, bool)
    if avro in ("double", "float"):
        return not isinstance(value, bool | str | bytes) and hasattr(type(value), "__float__")
    if avro == "bytes":
        return isinstance(value, bytes)
    return True  # a named type: the encoder's to judge


def _wanted(avro: Any) -> str:
    if isinstance(avro, list):
        kinds = [_wanted(t) for t in avro if t != "null"]
        return " or ".join(kinds) + (" (or null)" if "null" in avro else "")
    if isinstance(avro, dict) and avro.get("type") == "map":
        values = avro["values"]
        return f"a map of {values if isinstance(values, str) else 'record'} values"
    return _NAMES.get(avro, str(avro)) if isinstance(avro, str) else "a record"


def _held(value: Any, avro: Any) -> str:
    if isinstance(avro, dict) and avro.get("type") == "map" and isinstance(value, Mapping):
        odd = [k for k, v in value.items() if not isinstance(k, str)
               or not _fits(v, avro["values"])]
        shown = ", ".join(f"{k!r}: {type(value[k]).__name__}" for k in odd[:3])
        return f"{len(odd)} entr{'y' if len(odd) == 1 else 'ies'} that are not ({shown}" \
               f"{' ...' if len(odd) > 3 else ''})"
    return type(value).__name__  # (no value: refusals of one kind count as one)


def type_problems(record: Mapping[str, Any], fields: list[dict[str, Any]],
                  *, skip_missing: tuple[str, ...] = ()) -> list[str]:
    """One message per field of ``fields`` (an Avro record's) whose value in ``record`` is
    not of its type; a missing field counts as None (fine where the schema allows null or
    gives a default; ``skip_missing``: names whose absence another check reports)."""
    problems: list[str] = []
    for f in fields:
        name, avro = f["name"], f["type"]
        value = record.get(name)
        if value is None and ("default" in f or name in skip_missing):
            continue
        if not _fits(value, avro):
            if value is None:
                problems.append(f"{name} is missing ({_wanted(avro)})")
            else:
                problems.append(f"{name} must be {_wanted(avro)}, not {_held(value, avro)}")
    return problems
