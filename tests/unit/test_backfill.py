"""The backfill import's pure parsing: every line a Candidate or a LineError naming the
field (postbacks/core/backfill.py)."""

from __future__ import annotations

import json

import pytest

from postbacks.core.backfill import Candidate, LineError, parse_file, sniff_format
from postbacks.core.identity import delivery_id

BASE = {"legacy_id": "fw_1", "endpoint_id": "ep_a", "conversion_id": "cv_1",
        "event_type": "conversion", "occurred_at": "2026-03-01T12:00:00Z"}


def one(row: dict[str, object]) -> Candidate | LineError:
    out = list(parse_file(json.dumps(row), "jsonl"))
    assert len(out) == 1
    return out[0]


def test_a_full_jsonl_line_becomes_a_conversion() -> None:
    c = one({**BASE, "goal_id": "g1", "payout_usd": "1.25", "app_id": "app_1",
             "source_completed_at": 1772366400000, "source_snapshot": {"click_id": "ck9",
                                                                       "n": 3},
             "last_error": "HTTP 500", "legacy_url": "https://old/x"})
    assert isinstance(c, Candidate)
    assert c.delivery_id == delivery_id("ep_a", "cv_1", "conversion", "g1")
    conv = c.conversion
    assert conv["occurred_at"] == 1772366400000  # 2026-03-01T12:00:00Z
    assert conv["payout_usd_micros"] == 1_250_000
    assert conv["source_snapshot"] == {"click_id": "ck9", "n": "3"}
    assert conv["producer"] == "backfill" and conv["app_id"] == "app_1" and c.app_given
    assert conv["event_id"].startswith("evt_") and c.last_error == "HTTP 500"


def test_the_event_id_is_stable_per_legacy_row() -> None:
    a, b = one(BASE), one(BASE)
    assert isinstance(a, Candidate) and isinstance(b, Candidate)
    assert a.conversion["event_id"] == b.conversion["event_id"]
    assert not a.app_given and a.conversion["app_id"] == ""


@pytest.mark.parametrize(("change", "named"), [
    ({"legacy_id": None}, "legacy_id is required"),
    ({"endpoint_id": ""}, "endpoint_id is required"),
    ({"conversion_id": "has space"}, "conversion_id"),
    ({"event_type": "purchase"}, "event_type 'purchase' is not a known event type"),
    ({"event_type": None}, "event_type is required"),
    ({"occurred_at": None}, "occurred_at is required"),
    ({"occurred_at": "2026-03-01T12:00:00"}, "occurred_at"),  # no offset
    ({"occurred_at": "yesterday"}, "occurred_at"),
    ({"source_completed_at": True}, "source_completed_at"),
    ({"payout_usd": "1.2345678"}, "more than 6 decimal places"),
    ({"payout_usd": "abc"}, "payout_usd 'abc' is not a decimal"),
    ({"payout_usd_micros": "1.5"}, "payout_usd_micros"),
    ({"payout_usd_micros": -1}, "payout must be between"),
    ({"payout_usd_micros": 10**12 + 1}, "payout must be between 0 and 1,000,000 USD"),
    ({"payout_usd": "1000000.000001"}, "payout must be between"),
    ({"occurred_at": 1_700_000_000}, "before 2000-01-01"),  # epoch seconds
    ({"payout_usd": "1", "payout_usd_micros": 1}, "not both"),
    ({"conversion_id": "cv\x00"}, "conversion_id"),
    ({"last_error": "x" * 5000}, "last_error is longer"),
    ({"source_snapshot": [1, 2]}, "source_snapshot must be a JSON object"),
    ({"payout_usd_micro": 5}, "unknown column(s): 'payout_usd_micro'"),
    ({"goal_id": {"a": 1}}, "goal_id must be a string"),
])
def test_a_bad_line_names_the_field(change: dict[str, object], named: str) -> None:
    row = {**BASE, **change}
    out = one({k: v for k, v in row.items() if v is not None})
    assert isinstance(out, LineError), out
    assert named in out.message, out.message


def test_jsonl_lines_that_are_not_objects_are_reported_by_number() -> None:
    text = "\n".join([json.dumps(BASE), "{not json", "[1,2]", "", json.dumps(
        {**BASE, "legacy_id": "fw_2", "conversion_id": "cv_2"})])
    out = list(parse_file(text, "jsonl"))
    assert [type(x).__name__ for x in out] == ["Candidate", "LineError", "LineError",
                                              "Candidate"]
    assert [x.line for x in out] == [1, 2, 3, 5]
    assert isinstance(out[1], LineError) and out[1].message.startswith("not JSON")


def test_hostile_lines_are_line_errors() -> None:
    text = "\n".join(["[" * 100_000, '{"legacy_id": ' + "9" * 5000 + "}",
                      "x" * 200_000])
    out = list(parse_file(text, "jsonl"))
    assert [x.line for x in out] == [1, 2, 3]
    assert all(isinstance(x, LineError) for x in out)
    huge = "legacy_id,endpoint_id\n" + '"' + "y" * 200_000 + '",ep\nfw,ep\n'
    csv_out = list(parse_file(huge, "csv"))
    assert len(csv_out) == 1 and isinstance(csv_out[0], LineError)
    assert "cannot be read from here on" in csv_out[0].message


def test_csv_with_snapshot_columns_and_quoted_newlines() -> None:
    text = ("legacy_id,endpoint_id,conversion_id,event_type,occurred_at,snapshot.click_id,"
            "last_error,legacy_body\r\n"
            'fw_1,ep_a,cv_1,conversion,1772366400000,ck1,"line one\nline two",{}\r\n'
            "fw_2,ep_a,cv_2,reward,2026-03-01T13:00:00+01:00,,,\r\n"
            "fw_3,ep_a,cv_3,conversion\r\n")
    out = list(parse_file(text, "csv"))
    assert isinstance(out[0], Candidate) and isinstance(out[1], Candidate)
    assert out[0].conversion["source_snapshot"] == {"click_id": "ck1"}
    assert out[0].last_error == "line one\nline two"
    assert out[1].conversion["occurred_at"] == 1772366400000  # 13:00+01:00 = 12:00Z
    assert out[1].conversion["source_snapshot"] == {}
    assert isinstance(out[2], LineError) and out[2].line == 5  # lines 2-3 are one row
    assert "4 cells where the header has 8 columns" in out[2].message


def test_a_csv_header_with_an_unknown_column_stops_at_line_1() -> None:
    out = list(parse_file("legacy_id,endpoint,conversion_id\nfw,ep,cv\n", "csv"))
    assert len(out) == 1 and isinstance(out[0], LineError) and out[0].line == 1
    assert "'endpoint'" in out[0].message


def test_non_utf8_bytes_are_a_line_error_not_a_crash() -> None:
    # the file is read with surrogateescape: a \xff byte arrives as \udcff
    raw = json.dumps({**BASE, "last_error": "X"}, ensure_ascii=False).replace("X", "\udcff")
    bad = list(parse_file(raw, "jsonl"))
    assert isinstance(bad[0], LineError) and "last_error" in bad[0].message
    assert "not UTF-8" in bad[0].message


@pytest.mark.parametrize(("name", "head", "fmt"), [
    ("legacy.csv", "{", "csv"), ("x.jsonl", "a,b", "jsonl"), ("x.ndjson", "", "jsonl"),
    (None, '  {"a":1}', "jsonl"), (None, "legacy_id,endpoint_id", "csv"), ("x.txt", "", "csv"),
])
def test_sniff_format(name: str | None, head: str, fmt: str) -> None:
    assert sniff_format(name, head) == fmt
