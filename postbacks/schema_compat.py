"""The schema-evolution gate: can every schema version read the records of every older
one kept, and the previous version read the next one's?

Backward: a reader on the new version reads data written with the old one. Forward: a
reader still on the old version reads data written with the new one (deploy skew: the
producer upgraded first). Checked by Avro schema resolution on generated records of every
shape the writer allows, so a removed default, a changed type or a new required field is
caught. Backward over every pair, not only neighbours: the decoder resolves any older
writer's version straight to the newest reader, and two steps that each pass (v2 adds a
field with a default, v3 drops the default) can still leave v1's records unreadable by
v3. Forward between neighbours only: a deploy is skewed by one version at most.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Sequence
from typing import Any

import fastavro
from fastavro.schema import parse_schema
from fastavro.utils import generate_many

__all__ = ["backward_errors", "chain_errors", "compatibility_errors"]


def _reads(writer: Any, reader: Any, samples: int) -> str | None:
    for datum in generate_many(writer, samples):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, writer, datum)
        buf.seek(0)
        try:
            fastavro.schemaless_reader(buf, writer, reader)
        except Exception as exc:  # SchemaResolutionError and friends
            return f"{type(exc).__name__}: {exc}"
    return None


def compatibility_errors(old: dict[str, Any], new: dict[str, Any], samples: int = 50) -> list[str]:
    """Empty when ``new`` is backward and forward compatible with ``old``."""
    old_p = parse_schema(old, _write_hint=False)
    new_p = parse_schema(new, _write_hint=False)
    errors = []
    if (err := _reads(old_p, new_p, samples)) is not None:
        errors.append(f"not backward compatible (new reader, old data): {err}")
    if (err := _reads(new_p, old_p, samples)) is not None:
        errors.append(f"not forward compatible (old reader, new data): {err}")
    return errors


def chain_errors(versions: Sequence[dict[str, Any]], samples: int = 50) -> list[str]:
    """Empty when each version reads every older one's records (backward, every pair) and
    each neighbour pair is also forward compatible; else each failing pair's errors, named
    by the versions' positions (v1 first)."""
    out = []
    for (i, old), (j, new) in itertools.combinations(enumerate(versions), 2):
        errors = (compatibility_errors(old, new, samples) if j == i + 1
                  else backward_errors(old, new, samples))
        out += [f"v{i + 1} -> v{j + 1}: {err}" for err in errors]
    return out


def backward_errors(old: dict[str, Any], new: dict[str, Any], samples: int = 50) -> list[str]:
    """Empty when a reader on ``new`` reads data written with ``old``."""
    err = _reads(parse_schema(old, _write_hint=False), parse_schema(new, _write_hint=False),
                 samples)
    return [] if err is None else [f"not backward compatible (new reader, old data): {err}"]
