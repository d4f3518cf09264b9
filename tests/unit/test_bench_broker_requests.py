"""The broker request census (bench/broker_requests.py): lines of the broker's request
log counted by API, client and topic within a window; a prefix dropped from topic names;
unreadable lines counted, not fatal; a clear error without a log."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from bench.broker_requests import base_name, count, main, parse_start, registry_names, report


def _line(t_ms: int, api: str, client: str, **request: object) -> str:
    return f"{t_ms} Completed request:" + json.dumps({
        "requestHeader": {"requestApiKeyName": api, "clientId": client},
        "request": request, "response": {}, "totalTimeMs": 1.0})


def _produce(t_ms: int, client: str, topic: str, txn: str | None = None) -> str:
    return _line(t_ms, "PRODUCE", client, transactionalId=txn, acks=-1,
                 topicData=[{"name": topic, "partitionData": [{"index": 0}]}])


LINES = [
    _produce(999, "postbacks-emit", "p.conversions.v1"),  # before the window
    _produce(1000, "postbacks-emit", "p.conversions.v1"),
    _produce(1500, "postbacks-emit", "p.conversions.v1"),
    _produce(1600, "postbacks-fanout", "p.deliveries.v1", txn="p.postbacks-fanout-1"),
    _produce(1700, "postbacks-gate", "p.postbacks-gate-gate-endpoints-changelog"),
    _line(1800, "FETCH", "postbacks-agent", maxWaitMs=100, topics=[{"topicId": "x"}]),
    _line(1900, "END_TXN", "postbacks-fanout", transactionalId="p.postbacks-fanout-1"),
    "1950 Completed request:{not json",
    _line(1960, "PRODUCE", "odd", topicData=None),  # no topics: unreadable
    "[2026-12-07] WARN something else the broker said",
    _produce(3000, "postbacks-emit", "p.conversions.v1"),  # the window's end: not in it
]


def test_requests_in_the_window_are_counted_by_api_client_topic_and_transaction() -> None:
    got, bad = count(LINES, 1000, 3000, registry_names())
    assert got == {
        ("PRODUCE", "postbacks-emit", "conversions.v1", ""): 2,
        ("PRODUCE", "postbacks-fanout", "deliveries.v1", "transactional"): 1,
        ("PRODUCE", "postbacks-gate", "postbacks-gate-gate-endpoints-changelog", ""): 1,
        ("FETCH", "postbacks-agent", "", "waits up to 100 ms"): 1,
        ("END_TXN", "postbacks-fanout", "", ""): 1,
    }
    assert bad == 2
    text = report(got, 2.0, deliveries=4)
    assert text.splitlines()[0] == "6 requests in 2 s (3/s, 1.50 per delivery)"
    assert "by API: PRODUCE 4, FETCH 1, END_TXN 1" in text
    assert "      2      1   0.500  PRODUCE / postbacks-emit / conversions.v1" in text


def test_topic_names_lose_their_prefix_only_at_a_dot() -> None:
    names = registry_names()
    assert {"retry.5s.v1", "breakers.v1", "postbacks-gate-gate-global-changelog"} <= set(names)
    assert base_name("bench123lat.retry.5s.v1", names) == "retry.5s.v1"
    assert base_name("attempts.v1", names) == "attempts.v1"
    assert base_name("xattempts.v1", names) == "xattempts.v1"  # not a prefix: kept whole
    assert base_name("someone-elses-topic", names) == "someone-elses-topic"


def test_the_start_is_a_clock_time_today_or_epoch_seconds() -> None:
    day = dt.date(2026, 12, 7)
    local = dt.datetime(2026, 12, 7, 10, 10, 21, 640000).astimezone()
    assert parse_start("10:10:21.640", today=day) == int(local.timestamp() * 1000)
    assert parse_start("1796637164.5") == 1796637164500
    assert parse_start("1.001") == 1001  # rounded, not truncated
    for bad in ("ten past ten", "inf"):
        with pytest.raises(ValueError):
            parse_start(bad)


def test_the_command_line_says_what_is_wrong(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--log", str(tmp_path / "missing.log"), "--from", "1"])
    assert "no request log at" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--log", str(tmp_path / "missing.log"), "--from", "ten past"])
    assert "give HH:MM:SS" in capsys.readouterr().err
    for flag in ("--seconds", "--deliveries"):
        with pytest.raises(SystemExit):
            main(["--log", str(tmp_path / "missing.log"), "--from", "1", flag, "0"])
        assert f"{flag} must be more than 0" in capsys.readouterr().err
    log = tmp_path / "requests.log"
    log.write_text("\n".join(LINES) + "\n")
    assert main(["--log", str(log), "--from", "100", "--seconds", "1"]) == 1  # none in it
    assert "no requests in the 1 s from 100" in capsys.readouterr().err
    assert main(["--log", str(log), "--from", "1", "--seconds", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("6 requests in 2 s")
    assert "(2 request lines could not be read)" in out
