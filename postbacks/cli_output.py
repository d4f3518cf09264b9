"""Small output helpers shared by the operator commands (``held``, ``anomaly``)."""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
from collections.abc import Sequence
from typing import Any

import orjson

__all__ = ["fail", "iso", "print_json", "print_table", "shown", "usd"]

# Control characters a terminal acts on (ESC starts sequences that move the cursor, rewrite
# lines, set the title or the clipboard; CR overwrites a line; BEL ...), C1 included.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROL_OR_NEWLINE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def shown(text: object, *, lines: bool = True) -> str:
    """Text from outside (a receiver's response, a URL, an error message, a name) as it
    may reach a terminal: every control character written as a ``\\xNN`` escape, so an
    answer crafted for an operator's terminal prints as text; newlines and tabs kept when
    ``lines`` (else escaped too: one table cell, one line)."""
    pattern = _CONTROL if lines else _CONTROL_OR_NEWLINE
    return pattern.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


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
    cells = [[str(h) for h in headers], *[["-" if c is None else shown(c, lines=False)
                                           for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")
