"""What the broker is asked: its requests in a window of time, counted by API, client and
topic, from the local broker's request log.

Start the broker with the request log on (``deploy/local/kafka/log4j2-requests.properties``
says how), run the traffic (for example ``bench/delivery.py --parts latency``, which prints
when its timed traffic starts on this host's clock), then::

    .venv/bin/python bench/broker_requests.py --log /tmp/kafka-requests.log \\
        --from 10:10:21.640 --seconds 10 --deliveries 9000

Produce requests are split by topic (the registry's name, without a prefix; ``?`` where a
client names topics by id) and by whether they belong to a transaction; fetch requests by
client and their longest wait (a fetch names its topics by id). The product's clients carry
their stage in ``client.id`` (docs/operators.md). The log itself costs the broker CPU:
count with it, time without it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from topics import TOPICS
from topics.registry import TopicSpec

_MARK = " Completed request:"
Key = tuple[str, str, str, str]  # API, client, topics, detail


def registry_names() -> list[str]:
    """Every topic name the registry holds (the retry tiers and changelogs included)."""
    names: list[str] = []
    for value in vars(type(TOPICS)).values():
        specs = value if isinstance(value, tuple) else (value,)
        names += [spec.base for spec in specs if isinstance(spec, TopicSpec)]
    return names


def base_name(topic: str, bases: Iterable[str]) -> str:
    """The registry's name of ``topic`` (a prefix dropped), or ``topic`` itself."""
    found = [b for b in bases if topic == b or topic.endswith("." + b)]
    return max(found, key=len) if found else topic


def classify(request: dict[str, Any], bases: Iterable[str]) -> Key:
    header = request.get("requestHeader", {})
    api = str(header.get("requestApiKeyName", header.get("requestApiKey", "?")))
    client = str(header.get("clientId", ""))
    body = request.get("request") or {}
    if api == "PRODUCE":
        names = sorted({base_name(t.get("name", "?"), bases) for t in body.get("topicData", [])})
        txn = "transactional" if body.get("transactionalId") else ""
        return api, client, ",".join(names), txn
    if api == "FETCH":
        return api, client, "", f"waits up to {body.get('maxWaitMs', '?')} ms"
    return api, client, "", ""


def count(lines: Iterable[str], start_ms: int, end_ms: int,
          bases: Iterable[str]) -> tuple[Counter[Key], int]:
    """The requests completed within [start_ms, end_ms), by key; and the lines that could
    not be read."""
    got: Counter[Key] = Counter()
    bad = 0
    bases = list(bases)
    for line in lines:
        stamp, sep, rest = line.partition(_MARK)
        if not sep:
            continue
        try:
            t = int(stamp.strip())
            if not start_ms <= t < end_ms:
                continue
            got[classify(json.loads(rest), bases)] += 1
        except (ValueError, AttributeError, TypeError):
            bad += 1
    return got, bad


def parse_start(text: str, today: dt.date | None = None) -> int:
    """``HH:MM:SS[.fff]`` on this host's clock (today), or seconds since the epoch: ms. A
    bare number is always epoch seconds: ten o'clock is ``10:00:00``."""
    try:
        return round(float(text) * 1000)
    except (ValueError, OverflowError):
        pass
    clock = dt.time.fromisoformat(text)
    day = today or dt.date.today()
    return int(dt.datetime.combine(day, clock).astimezone().timestamp() * 1000)


def report(got: Counter[Key], seconds: float, deliveries: int | None) -> str:
    total = sum(got.values())
    rows = [f"{total:,} requests in {seconds:g} s ({total / seconds:,.0f}/s"
            + (f", {total / deliveries:.2f} per delivery" if deliveries else "") + ")"]
    by_api: Counter[str] = Counter()
    for (api, *_), n in got.items():
        by_api[api] += n
    rows.append("by API: " + ", ".join(f"{api} {n:,}" for api, n in by_api.most_common()))
    rows.append(f"{'count':>7} {'/s':>6} {'per dlv':>7}  API / client / topics / detail")
    for (api, client, topics, detail), n in got.most_common():
        per = f"{n / deliveries:7.3f}" if deliveries else f"{'':7}"
        what = " / ".join(x for x in (api, client or "(no client id)", topics, detail) if x)
        rows.append(f"{n:7,} {n / seconds:6.0f} {per}  {what}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log", type=Path, required=True, help="the broker's request log")
    ap.add_argument("--from", dest="start", required=True,
                    help="the window's start: HH:MM:SS[.fff] on this host's clock, today, "
                         "or seconds since the epoch (a bare number)")
    ap.add_argument("--seconds", type=float, default=10.0, help="the window's length (10)")
    ap.add_argument("--deliveries", type=int, default=None,
                    help="deliveries in the window: adds requests per delivery")
    args = ap.parse_args(argv)
    if args.seconds <= 0:
        ap.error("--seconds must be more than 0")
    if args.deliveries is not None and args.deliveries <= 0:
        ap.error("--deliveries must be more than 0")
    try:
        start = parse_start(args.start)
    except ValueError:
        ap.error(f"--from {args.start!r}: give HH:MM:SS[.fff] or seconds since the epoch")
    if not args.log.is_file():
        ap.error(f"no request log at {args.log} (deploy/local/kafka/"
                 "log4j2-requests.properties says how to start the broker with one)")
    with args.log.open(encoding="utf-8", errors="replace") as f:
        got, bad = count(f, start, start + int(args.seconds * 1000),
                         registry_names())
    if not got:
        print(f"no requests in the {args.seconds:g} s from {args.start} in {args.log}",
              file=sys.stderr)
        return 1
    print(report(got, args.seconds, args.deliveries))
    if bad:
        print(f"({bad} request lines could not be read)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
