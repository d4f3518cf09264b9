"""RepeatFilter: a client library's repeated line once per window, with a count."""

from __future__ import annotations

import logging

from postbacks.logfilter import RepeatFilter


def _record(name: str, msg: str, *args: object, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_the_same_kind_once_per_window_then_with_the_count() -> None:
    now = [0.0]
    f = RepeatFilter(["aiokafka"], window_s=10.0, clock=lambda: now[0])
    first = _record("aiokafka.consumer.fetcher", "Failed fetch messages from %s: %s", 2, "x")
    assert f.filter(first)
    assert first.getMessage() == "Failed fetch messages from 2: x"
    for i in range(30):  # ten a second for 3 s: other values, the same template
        now[0] += 0.1
        assert not f.filter(_record("aiokafka.consumer.fetcher",
                                    "Failed fetch messages from %s: %s", 2, f"y{i}"))
    now[0] = 10.5
    later = _record("aiokafka.consumer.fetcher", "Failed fetch messages from %s: %s", 2, "z")
    assert f.filter(later)
    assert later.getMessage() == ("Failed fetch messages from 2: z (30 more like this in the "
                                  "10 s before, not logged)")
    now[0] = 11.0
    assert not f.filter(_record("aiokafka.consumer.fetcher",
                                "Failed fetch messages from %s: %s", 2, "w"))


def test_other_kinds_and_other_loggers_pass() -> None:
    f = RepeatFilter(["aiokafka"], clock=lambda: 0.0)
    assert f.filter(_record("aiokafka.conn", "one %s", 1))
    assert f.filter(_record("aiokafka.conn", "another %s", 1))  # another template
    assert f.filter(_record("aiokafka.conn", "one %s", 1, level=logging.WARNING))  # level
    for _ in range(3):  # the product's own lines are never held back
        assert f.filter(_record("streams.relay", "one %s", 1))
        assert f.filter(_record("aiokafkaesque", "one %s", 1))  # not under the prefix


def test_one_record_through_two_handlers_is_decided_once() -> None:
    now = [0.0]
    f = RepeatFilter(["aiokafka"], clock=lambda: now[0])
    rec = _record("aiokafka.conn", "down %s", 1)
    assert f.filter(rec) and f.filter(rec)  # the second handler sees the same record
    again = _record("aiokafka.conn", "down %s", 2)
    assert not f.filter(again) and not f.filter(again)
    now[0] = 11.0
    later = _record("aiokafka.conn", "down %s", 3)
    assert f.filter(later) and f.filter(later)
    assert later.getMessage() == "down 3 (1 more like this in the 11 s before, not logged)"
