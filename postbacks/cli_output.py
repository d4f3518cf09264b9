"""Small output helpers shared by the operator commands (``held``, ``anomaly``)."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Sequence
from typing import Any

import orjson

__all__ = ["fail", "iso", "print_json", "print_table", "usd"]


def fail(args: argparse.Namespace, message: str, code: int) -> int:
    """One line on stderr naming the command; returns the exit code."""
    action = getattr(args, "action", None)
    name = f"{args.command} {action}" if action else str(args.command)
    print(f"postbacks {name}: error: {message}", file=sys.stderr)
    return code


def iso(ms: int | None) -> str:
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def usd(micros: int | None) -> str:
    return "-" if micros is None else f"${micros / 1_000_000:,.2f}"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(h) for h in headers], *[["-" if c is None else str(c) for c in r]
                                          for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")
