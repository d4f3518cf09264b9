"""The wire framing is Avro single-object encoding as the Avro specification defines it, so
any Avro library reads the product's records given the schema files alone: ``C3 01``, the
8-byte little-endian CRC-64-AVRO fingerprint of the writer schema's parsing canonical form,
the binary body. Checked here with plain fastavro and a from-the-spec fingerprint, not
with the product's codec. Both codec implementations (``POSTBACKS_AVRO_CODEC``) write these
same bytes."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import fastavro
import pytest
from fastavro.schema import UnknownType, fingerprint, parse_schema, to_parsing_canonical_form

from postbacks.codec import CODECS, Codec, codec_for, load_schema_versions
from schemas import avro_folder
from tests.unit.factories import make_conversion, make_delivery

# The Avro specification's "Schema Fingerprints": the 64-bit Rabin fingerprint.
_EMPTY = 0xC15D213AA4D7A795


def _table() -> list[int]:
    out = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY & -(fp & 1))
        out.append(fp)
    return out


_TABLE = _table()


def crc64_avro(data: bytes) -> int:
    fp = _EMPTY
    for b in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ b) & 0xFF]
    return fp


_VERSION = re.compile(r"\.v(\d+)\.avsc$")


def latest_schema_file(stem: str) -> dict[str, Any]:
    """The newest ``<stem>.v<N>.avsc``, read as JSON: what another team would be given."""
    files = {int(m.group(1)): p for p in avro_folder().iterdir()
             if p.name.startswith(f"{stem}.v") and (m := _VERSION.search(p.name))}
    assert files, stem
    return dict(json.loads(files[max(files)].read_text()))


def fastavro_schema(stem: str) -> Any:
    """The record's schema parsed by fastavro from the files alone (a file naming another
    record, not inlining it, is parsed with that record's file first)."""
    try:
        return parse_schema(latest_schema_file(stem), _write_hint=False)
    except UnknownType as exc:
        named: dict[str, Any] = {}
        parse_schema(latest_schema_file("conversion_event"), named_schemas=named,
                     _write_hint=False)
        assert exc.name in named, exc.name
        return parse_schema(latest_schema_file(stem), named_schemas=named, _write_hint=False)


CASES = [("ConversionEvent", "conversion_event", make_conversion),
         ("Delivery", "delivery", make_delivery)]


@pytest.mark.parametrize(("record", "stem", "make"), CASES)
def test_a_product_frame_decodes_with_plain_fastavro(record: str, stem: str,
                                                     make: Any) -> None:
    datum = make()
    frame = codec_for(record).encode(datum)
    schema = fastavro_schema(stem)
    assert frame[:2] == b"\xc3\x01"
    canonical = to_parsing_canonical_form(schema)
    fp_hex = fingerprint(canonical, "CRC-64-AVRO")
    assert frame[2:10] == bytes.fromhex(fp_hex)  # fastavro gives the bytes little-endian
    assert frame[2:10] == crc64_avro(canonical.encode()).to_bytes(8, "little")
    body = io.BytesIO(frame[10:])
    assert fastavro.schemaless_reader(body, schema, None) == datum
    assert body.tell() == len(frame) - 10  # the body is all that follows the header


@pytest.mark.parametrize(("record", "stem", "make"), CASES)
def test_plain_fastavro_bytes_framed_by_hand_decode_in_the_product(
        record: str, stem: str, make: Any) -> None:
    schema = fastavro_schema(stem)
    datum = make()
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, datum)
    fp = crc64_avro(to_parsing_canonical_form(schema).encode())
    assert codec_for(record).decode(b"\xc3\x01" + fp.to_bytes(8, "little") + buf.getvalue()) \
        == datum


@pytest.mark.parametrize("record", sorted(load_schema_versions()))
def test_every_shipped_version_is_named_by_its_spec_fingerprint(record: str) -> None:
    for v in load_schema_versions()[record]:
        canonical = to_parsing_canonical_form(parse_schema(v.schema, _write_hint=False))
        assert v.fingerprint == crc64_avro(canonical.encode())
        assert v.fingerprint.to_bytes(8, "little") == bytes.fromhex(
            fingerprint(canonical, "CRC-64-AVRO"))


@pytest.mark.parametrize("record", sorted(load_schema_versions()))
def test_both_codecs_write_and_read_the_same_frames(record: str) -> None:
    versions = load_schema_versions()[record]
    codecs = {impl: Codec(record, versions, impl) for impl in CODECS}
    c = codecs["c"]
    for seed in range(20):
        datum = _datum(c.writer.parsed, seed)
        frames = {impl: codec.encode(datum) for impl, codec in codecs.items()}
        assert len(set(frames.values())) == 1, record
        for codec in codecs.values():
            assert codec.decode_frame(frames["c"]) == c.decode_frame(frames["c"])


def _datum(schema: Any, seed: int) -> Any:
    """A record for ``schema`` (fastavro's parsed form): every field set, varied by seed."""
    def value(t: Any) -> Any:
        if isinstance(t, list):
            return None if seed % 3 == 0 else value(t[-1])
        if isinstance(t, dict):
            kind = t["type"]
            if kind == "record":
                return {f["name"]: value(f["type"]) for f in t["fields"]}
            if kind == "map":
                return {f"k{i}": value(t["values"]) for i in range(seed % 4)}
            if kind == "array":
                return [value(t["items"]) for _ in range(seed % 4)]
            if kind == "enum":
                return t["symbols"][seed % len(t["symbols"])]
            return value(kind)
        return {"string": f"s{seed}é", "bytes": bytes([seed]) * seed, "long": seed * 10**12,
                "int": -seed, "double": seed / 7, "float": 0.5, "boolean": seed % 2 == 0,
                "null": None}[t]
    return value(schema)


@pytest.mark.parametrize("record", sorted(load_schema_versions()))
def test_a_header_with_the_fingerprint_bytes_reversed_still_decodes(record: str) -> None:
    """Records written with the fingerprint's 8 bytes in big-endian order (older writers)
    stay readable by every reader, in both codec implementations."""
    for impl in CODECS:
        codec = Codec(record, load_schema_versions()[record], impl)
        frame = codec.encode(_datum(codec.writer.parsed, 5))
        reversed_header = frame[:2] + frame[2:10][::-1] + frame[10:]
        assert reversed_header != frame
        assert codec.decode_frame(reversed_header) == codec.decode_frame(frame)
