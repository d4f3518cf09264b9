"""The compiled Avro codecs against fastavro: the same bytes out, the same records back, and
a clear error -- never another exception or a wrong record -- on bad input."""

from __future__ import annotations

import contextlib
import io
import random
import string
from typing import Any

import fastavro
import pytest

from postbacks.avro_compiled import Unsupported, compile_schema
from postbacks.codec import MAGIC, codec_for, load_schema_versions
from postbacks.errors import UndecodableRecord

RECORDS = sorted(load_schema_versions())
TEXT = string.ascii_letters + string.digits + " _-:/{}\"\\\n" + "éü€日本🙂"


def _value(t: Any, rng: random.Random, named: dict[str, Any]) -> Any:
    if isinstance(t, list):
        return None if rng.random() < 0.3 else _value(t[1], rng, named)
    if isinstance(t, dict):
        if t["type"] == "record":
            named[t["name"]] = t
            return {f["name"]: _value(f["type"], rng, named) for f in t["fields"]}
        if t["type"] == "map":
            return {_value("string", rng, named): _value(t["values"], rng, named)
                    for _ in range(rng.choice((0, 1, 3, 70)))}
        return _value(t["type"], rng, named)
    if t in named:
        return _value(named[t], rng, named)
    size = rng.choice((0, 1, 5, 63, 64, 200))
    match t:
        case "string":
            return "".join(rng.choice(TEXT) for _ in range(size))
        case "bytes":
            return rng.randbytes(size)
        case "long":
            return rng.choice((0, -1, 1, 63, -64, 64, -65, 1_796_000_000_000, -(1 << 63),
                               (1 << 63) - 1, rng.randint(-(1 << 40), 1 << 40)))
        case "int":
            return rng.choice((0, -1, 64, -(1 << 31), (1 << 31) - 1, rng.randint(-999, 999)))
        case "double":
            return rng.choice((0.0, -1.5, 1e300, rng.random() * 1000))
        case "boolean":
            return rng.random() < 0.5
    raise AssertionError(t)


def _fastavro_bytes(schema: Any, datum: Any) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, datum)
    return buf.getvalue()


@pytest.mark.parametrize("record", RECORDS)
def test_same_bytes_and_records_as_fastavro(record: str) -> None:
    schema = codec_for(record).writer.parsed
    encode, decode, _ = compile_schema(schema, record)
    rng = random.Random(record)
    for _ in range(300):
        datum = _value(schema, rng, {})
        pieces: list[bytes] = []
        encode(datum, pieces.append)
        mine = b"".join(pieces)
        assert mine == _fastavro_bytes(schema, datum)
        back, end = decode(mine, 0)
        assert end == len(mine)
        assert back == datum == fastavro.schemaless_reader(io.BytesIO(mine), schema, None)


@pytest.mark.parametrize("record", RECORDS)
def test_absent_fields_take_their_defaults_like_fastavro(record: str) -> None:
    schema = codec_for(record).writer.parsed
    encode, _, _ = compile_schema(schema, record)
    datum = _value(schema, random.Random(1), {})
    for f in schema["fields"]:
        if "default" in f:
            del datum[f["name"]]
    pieces: list[bytes] = []
    encode(datum, pieces.append)
    assert b"".join(pieces) == _fastavro_bytes(schema, datum)


@pytest.mark.parametrize("record", RECORDS)
def test_every_truncation_and_corruption_is_undecodable(record: str) -> None:
    codec = codec_for(record)
    rng = random.Random(record)
    data = codec.encode(_value(codec.writer.parsed, rng, {}))
    for cut in range(10, len(data)):
        with pytest.raises(UndecodableRecord):
            codec.decode(data[:cut])
    with pytest.raises(UndecodableRecord, match="trailing"):
        codec.decode(data + b"\x00")
    for _ in range(300):  # flipped bytes: an error or a record, never anything else
        bad = bytearray(data)
        bad[rng.randrange(10, len(bad))] = rng.randrange(256)
        with contextlib.suppress(UndecodableRecord):
            codec.decode(bytes(bad))


@pytest.mark.parametrize(("field", "value"), [
    ("attempt", "1"), ("attempt", 1.5), ("attempt", 1 << 31), ("created_at", 1 << 64),
    ("delivery_id", 7), ("delivery_id", None), ("due_at", "soon"), ("trigger", b"x"),
])
def test_wrong_types_are_a_clear_encode_error(field: str, value: Any) -> None:
    codec = codec_for("Delivery")
    datum = _value(codec.writer.parsed, random.Random(2), {})
    datum[field] = value
    with pytest.raises(ValueError, match="Delivery: cannot encode"):
        codec.encode(datum)
    del datum[field]
    if field in ("delivery_id", "created_at"):  # no default: a missing field is an error
        with pytest.raises(ValueError, match="Delivery: cannot encode"):
            codec.encode(datum)


def test_a_union_branch_out_of_range_is_corrupt() -> None:
    _, decode, _ = compile_schema({"type": "record", "name": "R", "fields": [
        {"name": "x", "type": ["null", "long"]}]})
    with pytest.raises(ValueError, match="union branch 4"):
        decode(b"\x04\x02", 0)


def _varint(n: int) -> bytes:  # zig-zag, as Avro writes an int or a long, any size
    z, out = (n << 1) if n >= 0 else ((-n << 1) - 1), bytearray()
    while z > 127:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    return bytes(out + bytes([z]))


@pytest.mark.parametrize(("kind", "value", "fits"), [
    ("int", (1 << 31) - 1, True), ("int", -(1 << 31), True),
    ("int", 1 << 31, False), ("int", -(1 << 31) - 1, False), ("int", 1 << 40, False),
    ("long", (1 << 63) - 1, True), ("long", -(1 << 63), True),
    ("long", 1 << 63, False), ("long", -(1 << 63) - 1, False),
])
def test_an_int_or_a_long_beyond_its_range_is_corrupt(kind: str, value: int,
                                                         fits: bool) -> None:
    """A 32-bit column would otherwise take a wrapped value (binary COPY sends 4 bytes)."""
    _, decode, _ = compile_schema({"type": "record", "name": "R", "fields": [
        {"name": "x", "type": kind}]})
    if fits:
        assert decode(_varint(value), 0) == ({"x": value}, len(_varint(value)))
    else:
        with pytest.raises(ValueError, match=f"does not fit an Avro {kind}"):
            decode(_varint(value), 0)


def test_an_older_writers_int_beyond_its_range_is_undecodable() -> None:
    """Records of an older writer schema go through fastavro, which reads an int of any
    size: the codec holds the result to the writer's rules."""
    oldest, codec = load_schema_versions()["Delivery"][0], codec_for("Delivery")
    datum = _value(oldest.parsed, random.Random(3), {})
    frame = MAGIC + oldest.fingerprint.to_bytes(8, "little")  # Avro single-object header
    for attempt, ok in ((7, True), (1 << 31, False)):
        datum["attempt"] = attempt
        data = frame + _fastavro_bytes(oldest.parsed, datum)
        if ok:
            assert codec.decode(data)["attempt"] == 7
        else:
            with pytest.raises(UndecodableRecord, match="does not fit an Avro int"):
                codec.decode(data)


@pytest.mark.parametrize("record", RECORDS)
def test_every_older_writers_valid_records_still_decode(record: str) -> None:
    """The re-check of an older writer's record against the current rules must never
    refuse a valid one (a type promotion or a new field's default would)."""
    codec = codec_for(record)
    rng = random.Random(f"older-{record}")
    for version in load_schema_versions()[record][:-1]:
        for _ in range(100):
            datum = _value(version.parsed, rng, {})
            frame = MAGIC + version.fingerprint.to_bytes(8, "little")
            got = codec.decode(frame + _fastavro_bytes(version.parsed, datum))
            assert _shared(got, datum) == _shared(datum, got)  # fields added: their defaults


def _shared(a: Any, b: Any) -> Any:
    """``a`` with only the record fields (and map keys) ``b`` has too, at every depth."""
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _shared(v, b[k]) for k, v in a.items() if k in b}
    return a


def test_schemas_beyond_the_subset_are_refused() -> None:
    for t in ({"type": "array", "items": "long"}, ["string", "long"],
              {"type": "enum", "name": "E", "symbols": ["A"]}, "Unknown"):
        with pytest.raises(Unsupported):
            compile_schema({"type": "record", "name": "R", "fields": [{"name": "x", "type": t}]})
