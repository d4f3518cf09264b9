"""The C Avro codec (postbacks/avro_c.pyx) against fastavro: the same bytes out, the same
records back, and a clear error -- never another exception, a read past the buffer or a
wrong record -- on bad input."""

from __future__ import annotations

import collections
import contextlib
import io
import random
import string
import struct
from typing import Any

import fastavro
import pytest

from postbacks.avro_c import Unsupported, plan
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
    node = plan(schema)
    rng = random.Random(record)
    for _ in range(300):
        datum = _value(schema, rng, {})
        mine = node.encode(datum)
        assert mine == _fastavro_bytes(schema, datum)
        assert node.encode(datum, b"head") == b"head" + mine
        back, end = node.decode(mine, 0)
        assert end == len(mine)
        assert back == datum == fastavro.schemaless_reader(io.BytesIO(mine), schema, None)


@pytest.mark.parametrize("record", RECORDS)
def test_absent_fields_take_their_defaults_like_fastavro(record: str) -> None:
    schema = codec_for(record).writer.parsed
    datum = _value(schema, random.Random(1), {})
    for f in schema["fields"]:
        if "default" in f:
            del datum[f["name"]]
    assert plan(schema).encode(datum) == _fastavro_bytes(schema, datum)


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
    node = plan({"type": "record", "name": "R", "fields": [
        {"name": "x", "type": ["null", "long"]}]})
    with pytest.raises(ValueError, match="union branch 4"):
        node.decode(b"\x04\x02", 0)


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
    node = plan({"type": "record", "name": "R", "fields": [{"name": "x", "type": kind}]})
    if fits:
        assert node.decode(_varint(value), 0) == ({"x": value}, len(_varint(value)))
        assert node.encode({"x": value}) == _varint(value)
    else:
        with pytest.raises(ValueError, match=f"does not fit an Avro {kind}"):
            node.decode(_varint(value), 0)
        with pytest.raises(ValueError, match=f"does not fit an Avro {kind}"):
            node.encode({"x": value})


def test_an_older_writers_int_beyond_its_range_is_undecodable() -> None:
    """Records of an older writer schema are resolved by fastavro, which reads an int of any
    size: the codec reads them with the writer's schema in C first, held to its rules."""
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


EVOLVED = [r for r in RECORDS if len(load_schema_versions()[r]) > 1]


def test_some_records_have_older_versions() -> None:
    assert {"ConversionEvent", "Delivery"} <= set(EVOLVED)


@pytest.mark.parametrize("record", EVOLVED)
def test_every_older_writers_valid_records_still_decode(record: str) -> None:
    """Reading an older writer's record with its own schema first must never refuse a
    valid one, and fastavro's resolution must give the fields it lacks their defaults."""
    codec = codec_for(record)
    rng = random.Random(f"older-{record}")
    for version in load_schema_versions()[record][:-1]:
        for _ in range(100):
            datum = _value(version.parsed, rng, {})
            frame = MAGIC + version.fingerprint.to_bytes(8, "little")
            # the wire format alone (a Delivery's field checks: test_delivery_attempt_range)
            got = codec.decode_frame(frame + _fastavro_bytes(version.parsed, datum))
            assert _shared(got, datum) == _shared(datum, got)
            _assert_defaults(got, datum, codec.writer.parsed)


def _assert_defaults(got: Any, old: Any, schema: Any) -> None:
    """Every field of ``schema`` absent from the older datum ``old`` holds its default."""
    if isinstance(schema, list):  # ["null", T]
        if got is not None:
            _assert_defaults(got, old, schema[1])
        return
    if not (isinstance(schema, dict) and schema.get("type") == "record"):
        return
    for f in schema["fields"]:
        if f["name"] in old:
            _assert_defaults(got[f["name"]], old[f["name"]], f["type"])
        else:
            assert got[f["name"]] == f["default"], f["name"]


def _shared(a: Any, b: Any) -> Any:
    """``a`` with only the record fields (and map keys) ``b`` has too, at every depth."""
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _shared(v, b[k]) for k, v in a.items() if k in b}
    return a


def test_schemas_beyond_the_subset_are_refused() -> None:
    for t in ({"type": "array", "items": "long"}, ["string", "long"],
              {"type": "enum", "name": "E", "symbols": ["A"]}, "Unknown"):
        with pytest.raises(Unsupported):
            plan({"type": "record", "name": "R", "fields": [{"name": "x", "type": t}]})


def test_an_older_writers_long_beyond_64_bits_is_undecodable() -> None:
    """fastavro alone wraps it (2^63 read back as 0); the writer-schema read refuses it."""
    oldest, codec = load_schema_versions()["Delivery"][0], codec_for("Delivery")
    datum = _value(oldest.parsed, random.Random(4), {})
    datum["created_at"] = 7
    good = _fastavro_bytes(oldest.parsed, datum)
    frame = MAGIC + oldest.fingerprint.to_bytes(8, "little")
    assert codec.decode_frame(frame + good)["created_at"] == 7
    other = _fastavro_bytes(oldest.parsed, {**datum, "created_at": 8})
    prefix_len = next(i for i, (a, b) in enumerate(zip(good, other, strict=True)) if a != b)
    data = frame + good[:prefix_len] + _varint(1 << 63) + good[prefix_len + 1:]
    with pytest.raises(UndecodableRecord, match="does not fit an Avro long"):
        codec.decode_frame(data)


R_ALL = {"type": "record", "name": "R", "fields": [
    {"name": "s", "type": "string"}, {"name": "b", "type": "bytes"},
    {"name": "f", "type": "float"}, {"name": "d", "type": "double"},
    {"name": "t", "type": "boolean"}, {"name": "n", "type": "null"},
    {"name": "m", "type": {"type": "map", "values": ["null", "long"]}},
    {"name": "i", "type": "int", "default": 3},
]}


def test_every_kind_round_trips_like_fastavro() -> None:
    node = plan(R_ALL)
    datum = {"s": "é🙂", "b": b"\x00\xff", "f": 1.5, "d": -2.25, "t": True, "n": None,
             "m": {"a": None, "": 1 << 62}, "i": -1}
    data = node.encode(datum)
    assert data == _fastavro_bytes(R_ALL, datum)
    assert node.decode(data) == (datum, len(data))
    assert node.decode(bytearray(data)) == node.decode(memoryview(data)) == (datum, len(data))


class _Str(str):
    pass


def test_int_like_and_buffer_values_encode_as_their_type() -> None:
    node = plan(R_ALL)
    datum = {"s": _Str("x"), "b": bytearray(b"ab"), "f": 2, "d": 3, "t": False, "n": None,
             "m": {}}
    plain = {"s": "x", "b": b"ab", "f": 2.0, "d": 3.0, "t": False, "n": None, "m": {},
             "i": 3}
    assert node.encode(datum) == node.encode({**datum, "b": memoryview(b"ab")}) \
        == _fastavro_bytes(R_ALL, plain)
    assert node.decode(node.encode(datum))[0] == plain


@pytest.mark.parametrize(("field", "value", "error"), [
    ("s", b"x", TypeError), ("s", "\ud800", ValueError), ("b", "x", TypeError),
    ("f", 1e39, ValueError), ("f", "1", TypeError), ("d", None, TypeError),
    ("t", 1, TypeError), ("n", 0, TypeError), ("m", {1: None}, TypeError),
    ("m", {"a": "1"}, AttributeError), ("i", 1.0, AttributeError),
])
def test_a_wrong_value_is_a_type_or_value_error(field: str, value: Any,
                                                 error: type[Exception]) -> None:
    datum = {"s": "x", "b": b"", "f": 0.0, "d": 0.0, "t": True, "n": None, "m": {}}
    with pytest.raises(error):
        plan(R_ALL).encode({**datum, field: value})


def test_a_missing_field_without_default_is_a_key_error() -> None:
    datum = {"s": "x", "b": b"", "f": 0.0, "d": 0.0, "t": True, "n": None, "m": {}}
    assert plan(R_ALL).encode(datum)  # complete, and "i" takes its default
    with pytest.raises(KeyError, match="'s'"):
        plan(R_ALL).encode({k: v for k, v in datum.items() if k != "s"})


@pytest.mark.parametrize(("data", "match"), [
    (b"\x80" * 10 + b"\x00", "longer than 10 bytes"),
    (b"\x02" + b"\xff\xff", "invalid|unexpected|decode"),  # not UTF-8
    (b"\xfe\xff\xff\xff\x0f", "runs past"),  # a 2^31-byte string in 6 bytes
    (b"\x01", "runs past"),  # a negative length
    (b"\x00\x00\x00\x00", "ends inside a number"),  # the float cut short
])
def test_corrupt_input_is_a_clear_value_error(data: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        plan(R_ALL).decode(data)


def test_map_blocks_with_byte_sizes_and_hostile_counts() -> None:
    node = plan({"type": "map", "values": "long"})
    # a block of -2 entries with its size in bytes, then one of 1, then the end
    data = b"\x03" + b"\x08" + b"\x02a\x02" + b"\x02b\x04" + b"\x02" + b"\x02c\x06" + b"\x00"
    assert node.decode(data) == ({"a": 1, "b": 2, "c": 3}, len(data))
    for hostile in (_varint(-(1 << 63)), _varint(1 << 40), _varint(-(1 << 40)) + b"\x00"):
        with pytest.raises(ValueError):
            node.decode(hostile)


def test_random_bytes_never_crash_the_decoder() -> None:
    rng = random.Random(5)
    nodes = [plan(codec_for(r).writer.parsed) for r in RECORDS] + [plan(R_ALL)]
    for _ in range(3000):
        data = rng.randbytes(rng.choice((0, 1, 3, 17, 64, 300)))
        for node in nodes:
            with contextlib.suppress(ValueError):
                node.decode(data, rng.randrange(len(data) + 1))
    with pytest.raises(ValueError, match="outside"):
        nodes[0].decode(b"abc", 4)


def test_values_whose_conversion_mutates_the_datum_do_not_crash_the_encoder() -> None:
    """The encoder holds its own reference to every value it reads from a dict: a value's
    ``__index__`` emptying the dict around it must not leave it reading freed memory."""
    inner = {"type": "record", "name": "I", "fields": [
        {"name": "a", "type": "long"}, {"name": "b", "type": "long"}]}
    outer_node = plan({"type": "record", "name": "O", "fields": [{"name": "inner", "type": inner}]})
    in_map = plan({"type": "record", "name": "O", "fields": [
        {"name": "m", "type": {"type": "map", "values": "long"}}]})
    keep: list[Any] = []

    class Clears:
        def __index__(self) -> int:
            outer.clear()
            keep.extend({"b": 999_999} for _ in range(100))  # reuses freed dicts' memory
            return 1

    outer: dict[str, Any] = {"inner": {"a": Clears(), "b": 2}}
    assert outer_node.encode(outer) == b"\x02\x04"
    outer = {"m": {"a": Clears(), "b": 2}}
    assert in_map.encode(outer) == b"\x04\x02a\x02\x02b\x04\x00"
    map_node = plan({"type": "map", "values": "long"})

    class Grows:
        def __index__(self) -> int:
            m.update({f"x{i}": i for i in range(3)})
            return 1

    m: dict[str, Any] = {"a": Grows(), "b": 2}
    with pytest.raises((ValueError, RuntimeError)):  # never a count that lies about the map
        map_node.decode(map_node.encode(m))


def test_what_fastavro_refuses_is_refused() -> None:
    node = plan(R_ALL)
    datum = {"s": "x", "b": b"", "f": 0.0, "d": 0.0, "t": True, "n": None}
    for bad_map in (None, 0):
        with pytest.raises(TypeError):
            node.encode({**datum, "m": bad_map})
    filled = collections.defaultdict(lambda: 7, {**datum, "m": {}})
    del filled["s"]
    with pytest.raises(KeyError):  # not the defaultdict's 7, nor a key added to it
        node.encode(filled)
    assert "s" not in filled
    with pytest.raises(TypeError):
        node.encode({**datum, "m": {}}, None)  # type: ignore[arg-type]
    # a double that rounds to the largest float is a float; one beyond it is not
    ok = plan({"type": "float"})
    assert ok.encode(3.4028235170913096e38) == struct.pack("<f", 3.4028235170913096e38)
    with pytest.raises(ValueError, match="does not fit an Avro float"):
        ok.encode(3.5e38)


def test_a_recursive_schema_is_refused() -> None:
    """Decoding walks the schema in C: a self-referring record would let a long enough
    hostile record overflow the stack."""
    with pytest.raises(Unsupported, match="recursive"):
        plan({"type": "record", "name": "L", "fields": [
            {"name": "next", "type": ["null", "L"]}]})
    # a named type used twice, not inside itself, is fine
    inner = {"type": "record", "name": "I", "fields": [{"name": "a", "type": "long"}]}
    node = plan({"type": "record", "name": "O", "fields": [
        {"name": "x", "type": inner}, {"name": "y", "type": "I"}]})
    assert node.decode(node.encode({"x": {"a": 1}, "y": {"a": 2}}))[0] == {
        "x": {"a": 1}, "y": {"a": 2}}


def test_a_number_too_large_for_a_double_is_an_encode_error() -> None:
    codec = codec_for("Attempt")
    datum = _value(codec.writer.parsed, random.Random(6), {})
    with pytest.raises(ValueError, match="Attempt: cannot encode"):
        codec.encode({**datum, "queue_ms": 10**400})
