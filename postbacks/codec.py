"""Avro encoding of every message on every topic (fastavro).

Wire framing: **Avro single-object encoding** (Avro 1.8+ spec): ``C3 01`` + the 8-byte
little-endian CRC-64-AVRO fingerprint of the writer schema + the binary body. Why this and
not the Confluent framing (``00`` + 4-byte registry id): it needs no schema-registry
service, the fingerprint is computed from the schema itself (so every producer and every
consumer agree without coordination), and it is a published Avro standard any language's
Avro library can read. Every schema version the code has ever written ships in
``schemas/avro/`` (``<record>.v<N>.avsc``); a reader resolves from the writer version named
by the fingerprint to its own (latest) version, so producers and consumers on different
code during a rolling deploy keep working (the evolution gate in ``tests/contract`` proves
each version pair both ways).

Encoding, and decoding a record written with any known version, run in C
(:mod:`postbacks.avro_c`, built from ``avro_c.pyx`` at install; the same bytes as
fastavro). A record of an older writer version is read with that version's schema first --
every int and long held to its range -- and then resolved to ours by fastavro's resolving
reader (field defaults, promotions). ``POSTBACKS_AVRO_CODEC=fastavro`` (read once per
process) runs plain fastavro instead -- ``schemaless_writer`` / ``schemaless_reader`` with
the same framing and the same bytes -- so the two can be compared on the whole pipeline
(``bench/avro_choice.py``; docs/decisions/0002-avro-codec.md).

Anything that is not a known record — garbage, a truncated body, an unknown fingerprint, a
record of another type — raises :class:`UndecodableRecord`; stages send it to the DLQ with
its original bytes.
"""

from __future__ import annotations

import io
import json
import re
import struct
from dataclasses import dataclass
from functools import cache
from typing import Any, cast

import fastavro
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

try:
    from postbacks.avro_c import Node, plan
except ImportError as exc:  # a checkout whose extension was never built (or cleaned away)
    raise ImportError("postbacks.avro_c, the Avro codec's C extension, is not built here: "
                      "run `make install` (or `pip install -e .`) in the checkout") from exc
from postbacks.errors import ConfigError, InvalidRecord, UndecodableRecord
from schemas import avro_folder

__all__ = [
    "CODECS",
    "MAGIC",
    "Codec",
    "SchemaVersion",
    "codec_for",
    "load_schema_versions",
]

MAGIC = b"\xc3\x01"
CODECS = ("c", "fastavro")  # POSTBACKS_AVRO_CODEC
_HEADER = struct.Struct("<2sQ")
_FILE_RE = re.compile(r"^(?P<stem>[a-z_]+)\.v(?P<version>\d+)\.avsc$")

RECORD_FILES: dict[str, str] = {
    "ConversionEvent": "conversion_event",
    "Delivery": "delivery",
    "Attempt": "attempt",
    "Outcome": "outcome",
    "DeadLetter": "dead_letter",
    "BreakerState": "breaker_state",
    "PayoutPartial": "payout_partial",
    "OperationalEvent": "operational_event",
}

# Records that embed another record by name: the embedded record's versions multiply.
_EMBEDS: dict[str, str] = {"Delivery": "ConversionEvent"}


@dataclass(frozen=True, slots=True)
class SchemaVersion:
    record: str
    version: int
    schema: dict[str, Any]  # JSON form with embedded records inlined
    parsed: Any
    fingerprint: int


def _raw_versions() -> dict[str, dict[int, dict[str, Any]]]:
    out: dict[str, dict[int, dict[str, Any]]] = {}
    stem_to_record = {v: k for k, v in RECORD_FILES.items()}
    folder = avro_folder()
    for entry in folder.iterdir():
        m = _FILE_RE.match(entry.name)
        if not m:
            continue
        record = stem_to_record.get(m.group("stem"))
        if record is None:
            continue
        out.setdefault(record, {})[int(m.group("version"))] = json.loads(entry.read_text())
    return out


def _inline(schema: dict[str, Any], name: str, embedded: dict[str, Any]) -> dict[str, Any]:
    fields = []
    for f in schema["fields"]:
        t = f["type"]
        if t == name or (isinstance(t, dict) and t.get("name") == name):
            f = {**f, "type": embedded}
        fields.append(f)
    return {**schema, "fields": fields}


def _make(record: str, version: int, schema: dict[str, Any]) -> SchemaVersion:
    # The fingerprint comes from the plain canonical form; the hinted parse (which fastavro
    # recognises and does not re-parse on every call) is what reads and writes use.
    canonical = to_parsing_canonical_form(parse_schema(schema, _write_hint=False))
    parsed = parse_schema(schema)
    # fastavro gives the fingerprint's 8 bytes little-endian, as they go on the wire
    fp = int.from_bytes(bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")), "little")
    return SchemaVersion(record, version, schema, parsed, fp)


@cache
def load_schema_versions() -> dict[str, list[SchemaVersion]]:
    """Every known version of every record, oldest first; the last one is the reader's.

    For a record embedding another, each (own version x embedded version) combination is a
    version of its own (the embedded record's latest inlined last).
    """
    raw = _raw_versions()
    out: dict[str, list[SchemaVersion]] = {}
    for record, versions in raw.items():
        combos: list[SchemaVersion] = []
        for v in sorted(versions):
            embedded_name = _EMBEDS.get(record)
            if embedded_name is None:
                combos.append(_make(record, v, versions[v]))
                continue
            for ev in sorted(raw[embedded_name]):
                schema = _inline(versions[v], embedded_name, raw[embedded_name][ev])
                combos.append(_make(record, v * 1000 + ev, schema))
        out[record] = combos
    return out


class Codec:
    """Encode with the latest version of one record; decode any known version of it.

    ``impl``: ``"c"`` (:mod:`postbacks.avro_c`) or ``"fastavro"``; the bytes are the same."""

    def __init__(self, record: str, versions: list[SchemaVersion], impl: str = "c") -> None:
        if not versions:
            raise ValueError(f"no schema versions for {record}")
        if impl not in CODECS:
            raise ConfigError(f"POSTBACKS_AVRO_CODEC={impl!r}: expected one of "
                              f"{', '.join(CODECS)}")
        self.record = record
        self.impl = impl
        self._fastavro = impl == "fastavro"
        self.writer = versions[-1]
        self._prefix = _HEADER.pack(MAGIC, self.writer.fingerprint)
        # Each version is also known by its fingerprint's bytes in reverse order (big-endian
        # on the wire), which records already on the topics may carry.
        self._by_fp = {fp: v for v in versions for fp in (v.fingerprint, _swapped(v.fingerprint))}
        # Every schema we ship is in avro_c's subset (tests/unit/test_avro_c.py); one that is
        # not is a programming error, raised (Unsupported) when its codec is first built.
        self._plans: dict[int, Node] = {}
        for fp, v in self._by_fp.items():
            self._plans[fp] = self._plans.get(_swapped(fp)) or plan(v.parsed)
        self._node = self._plans[self.writer.fingerprint]

    def encode(self, datum: dict[str, Any] | Any) -> bytes:
        try:
            if self._fastavro:
                buf = io.BytesIO()
                buf.write(self._prefix)
                fastavro.schemaless_writer(buf, self.writer.parsed, datum)
                return buf.getvalue()
            return self._node.encode(datum, self._prefix)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            raise ValueError(f"{self.record}: cannot encode: {exc}") from exc

    def decode(self, data: bytes | None) -> dict[str, Any]:
        value = self.decode_frame(data)
        if self.record == "Delivery":
            _check_delivery(value)
        return value

    def decode_frame(self, data: bytes | None) -> dict[str, Any]:
        """The wire format alone: the record as written, without :meth:`decode`'s checks
        of its fields."""
        if data is None:
            raise UndecodableRecord(f"{self.record}: empty message (tombstone)")
        if len(data) < _HEADER.size:
            raise UndecodableRecord(f"{self.record}: {len(data)} bytes is too short for a frame")
        magic, fp = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise UndecodableRecord(
                f"{self.record}: not Avro single-object encoding (magic {magic.hex()})"
            )
        node = self._plans.get(fp)
        if node is None:
            raise UndecodableRecord(
                f"{self.record}: unknown writer schema fingerprint {fp:016x} "
                "(a newer producer, or another record type)"
            )
        if self._fastavro:
            return self._decode_fastavro(data, fp, node is self._node)
        try:  # read with the writer's own schema: every int and long held to its range
            value, end = node.decode(data, _HEADER.size)
        except ValueError as exc:
            raise UndecodableRecord(f"{self.record}: corrupt body: {exc!r}") from exc
        if end != len(data):
            raise UndecodableRecord(
                f"{self.record}: {len(data) - end} trailing bytes after the record"
            )
        if node is self._node:
            return cast(dict[str, Any], value)
        buf = io.BytesIO(data)
        buf.seek(_HEADER.size)
        try:  # an older writer version, well formed: fastavro resolves it to ours
            return cast(dict[str, Any], fastavro.schemaless_reader(
                buf, self._by_fp[fp].parsed, self.writer.parsed))
        except Exception as exc:  # fastavro raises many types on corrupt input
            raise UndecodableRecord(f"{self.record}: corrupt body: {exc!r}") from exc

    def _decode_fastavro(self, data: bytes, fp: int, latest: bool) -> dict[str, Any]:
        buf = io.BytesIO(data)
        buf.seek(_HEADER.size)
        try:
            value = fastavro.schemaless_reader(
                buf, self._by_fp[fp].parsed, None if latest else self.writer.parsed)
        except Exception as exc:  # fastavro raises many types on corrupt input
            raise UndecodableRecord(f"{self.record}: corrupt body: {exc!r}") from exc
        if buf.tell() != len(data):
            raise UndecodableRecord(
                f"{self.record}: {len(data) - buf.tell()} trailing bytes after the record"
            )
        return cast(dict[str, Any], value)


MAX_ATTEMPT = 1_000_000  # attempts already made: far above any retry schedule or replays


def _check_delivery(d: dict[str, Any]) -> None:
    """A delivery's ``attempt`` becomes ``attempt + 1`` in its outcome and attempt records
    (Avro ints): one near 2**31 from a foreign producer failed that encode in every stage
    that read it, a crash loop on its partition. Refused here, as every stage decodes."""
    attempt = d.get("attempt", 0)
    if not 0 <= attempt <= MAX_ATTEMPT:
        raise InvalidRecord(f"Delivery: attempt {attempt} is outside 0..{MAX_ATTEMPT}")


def _swapped(fp: int) -> int:
    return int.from_bytes(fp.to_bytes(8, "little"), "big")


@cache
def codec_choice() -> str:
    """``POSTBACKS_AVRO_CODEC`` of this process (``c`` unless set), read once."""
    from postbacks.settings import load_settings

    choice = load_settings().avro_codec
    if choice not in CODECS:
        raise ConfigError(f"POSTBACKS_AVRO_CODEC={choice!r}: expected one of {', '.join(CODECS)}")
    return choice


@cache
def codec_for(record: str) -> Codec:
    versions = load_schema_versions().get(record)
    if not versions:
        raise KeyError(f"unknown record {record!r}")
    return Codec(record, versions, codec_choice())
