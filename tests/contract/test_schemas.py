"""The schema-evolution gate and the records' contract."""

from __future__ import annotations

import itertools
import json
import typing
from pathlib import Path

import fastavro.schema
import pytest

from postbacks import records
from postbacks.codec import RECORD_FILES, load_schema_versions
from postbacks.schema_compat import chain_errors, compatibility_errors

AVRO = Path(__file__).resolve().parents[2] / "schemas" / "avro"
FIXTURES = Path(__file__).parent / "fixtures"


def _versions(stem: str) -> list[dict[str, typing.Any]]:
    files = sorted(AVRO.glob(f"{stem}.v*.avsc"), key=lambda p: int(p.name.split(".v")[1][:-5]))
    return [json.loads(p.read_text()) for p in files]


def _standalone(stem: str) -> list[dict[str, typing.Any]]:
    """Each version with the records it embeds by name inlined (their latest version)."""
    out = []
    for schema in _versions(stem):
        fields = []
        for f in schema["fields"]:
            if isinstance(f["type"], str) and f["type"] in RECORD_FILES:
                f = {**f, "type": _versions(RECORD_FILES[f["type"]])[-1]}
            fields.append(f)
        out.append({**schema, "fields": fields})
    return out


@pytest.mark.parametrize("stem", sorted(RECORD_FILES.values()))
def test_every_version_is_backward_and_forward_compatible_with_every_other(stem: str) -> None:
    versions = _standalone(stem)
    assert versions, f"no schema files for {stem}"
    assert chain_errors(versions) == []


def test_a_chain_whose_neighbours_pass_but_whose_ends_do_not_is_refused() -> None:
    """v2 adds ``b`` with a default, v3 drops the default: each step passes, but v3 cannot
    read v1's records (no ``b``, no default), which the decoder would meet on any topic
    still holding v1 records."""
    def version(*fields: dict[str, typing.Any]) -> dict[str, typing.Any]:
        return {"type": "record", "name": "R", "namespace": "t",
                "fields": [{"name": "a", "type": "string"}, *fields]}

    v1 = version()
    v2 = version({"name": "b", "type": "string", "default": ""})
    v3 = version({"name": "b", "type": "string"})
    assert all(not compatibility_errors(o, n) for o, n in itertools.pairwise((v1, v2, v3)))
    errors = chain_errors([v1, v2, v3])
    assert errors == [errors[0]] and errors[0].startswith(
        "v1 -> v3: not backward compatible"), errors


def test_a_field_may_be_dropped_two_versions_after_it_got_a_default() -> None:
    """Forward compatibility is a one-version deploy skew: v1 need not read v3's records
    (v1 declared ``b`` without a default, v2 gave it one, v3 dropped it)."""
    def version(*fields: dict[str, typing.Any]) -> dict[str, typing.Any]:
        return {"type": "record", "name": "R", "namespace": "t",
                "fields": [{"name": "a", "type": "string"}, *fields]}

    v1 = version({"name": "b", "type": "string"})
    v2 = version({"name": "b", "type": "string", "default": ""})
    v3 = version()
    assert compatibility_errors(v1, v3)  # not forward: v1 cannot read v3 (no b)
    assert chain_errors([v1, v2, v3]) == []


def test_conversion_event_has_a_prior_version_kept() -> None:
    assert len(_versions("conversion_event")) >= 2


@pytest.mark.parametrize("fixture", sorted(FIXTURES.glob("conversion_event.v3.*.avsc")),
                         ids=lambda p: p.name)
def test_the_gate_rejects_incompatible_changes(fixture: Path) -> None:
    latest = _versions("conversion_event")[-1]
    assert compatibility_errors(latest, json.loads(fixture.read_text()))


@pytest.mark.parametrize("stem", sorted(RECORD_FILES.values()))
def test_every_schema_is_documented_and_namespaced(stem: str) -> None:
    schema = _versions(stem)[-1]
    assert schema.get("doc") and schema.get("namespace") == "postbacks"


@pytest.mark.parametrize(
    ("record", "typed"),
    [("ConversionEvent", records.ConversionEvent), ("Delivery", records.DeliveryRecord),
     ("Attempt", records.AttemptRecord), ("Outcome", records.OutcomeRecord),
     ("DeadLetter", records.DeadLetterRecord), ("BreakerState", records.BreakerStateRecord),
     ("OperationalEvent", records.OperationalEventRecord)],
)
def test_typed_views_match_the_latest_schema(record: str, typed: type) -> None:
    latest = load_schema_versions()[record][-1].schema
    assert [f["name"] for f in latest["fields"]] == list(typing.get_type_hints(typed))


ALL_FILES = sorted(AVRO.glob("*.avsc"))


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: p.name)
def test_every_schema_file_parses_alone_with_plain_fastavro(path: Path) -> None:
    """A producer in any language can take one file and use it: no named type is left for
    a registry or a neighbouring file to supply."""
    parsed = fastavro.schema.load_schema(str(path), _write_hint=False)
    assert parsed["name"] == "postbacks." + json.loads(path.read_text())["name"]


def _undocumented(schema: dict[str, typing.Any], where: str) -> list[str]:
    missing = [] if schema.get("doc") else [where]
    for f in schema.get("fields", []):
        if not f.get("doc"):
            missing.append(f"{where}.{f['name']}")
        for t in f["type"] if isinstance(f["type"], list) else [f["type"]]:
            if isinstance(t, dict) and t.get("type") == "record":
                missing += _undocumented(t, f"{where}.{f['name']}")
    return missing


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: p.name)
def test_every_record_and_field_has_a_doc_string(path: Path) -> None:
    schema = json.loads(path.read_text())
    assert _undocumented(schema, schema["name"]) == []


@pytest.mark.parametrize("path", sorted(AVRO.glob("delivery.v*.avsc")), ids=lambda p: p.name)
def test_an_embedded_record_is_one_of_its_own_versions(path: Path) -> None:
    """The conversion snapshot inlined in a Delivery file is, byte for byte in JSON terms, one
    of the ConversionEvent files (the codec combines every Delivery version with every
    ConversionEvent version; the inlined one keeps the file standalone)."""
    conversion = next(f["type"] for f in json.loads(path.read_text())["fields"]
                      if f["name"] == "conversion")
    assert conversion in _versions("conversion_event")


def test_a_field_without_a_doc_is_caught() -> None:
    schema = {"name": "R", "doc": "r", "fields": [
        {"name": "a", "type": "string", "doc": "a"},
        {"name": "inner", "doc": "i", "type": {"type": "record", "name": "I", "doc": "i",
                                               "fields": [{"name": "b", "type": "int"}]}}]}
    assert _undocumented(schema, "R") == ["R.inner.b"]
