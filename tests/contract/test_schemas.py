"""The schema-evolution gate and the records' contract."""

from __future__ import annotations

import itertools
import json
import typing
from pathlib import Path

import pytest

from postbacks import records
from postbacks.codec import RECORD_FILES, load_schema_versions
from postbacks.schema_compat import compatibility_errors

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
def test_every_version_is_backward_and_forward_compatible_with_the_previous(stem: str) -> None:
    versions = _standalone(stem)
    assert versions, f"no schema files for {stem}"
    for old, new in itertools.pairwise(versions):
        assert compatibility_errors(old, new) == []


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
     ("DeadLetter", records.DeadLetterRecord), ("BreakerState", records.BreakerStateRecord)],
)
def test_typed_views_match_the_latest_schema(record: str, typed: type) -> None:
    latest = load_schema_versions()[record][-1].schema
    assert [f["name"] for f in latest["fields"]] == list(typing.get_type_hints(typed))
