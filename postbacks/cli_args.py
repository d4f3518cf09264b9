"""Argument types shared by every command: a bad value is argparse's one-line usage error
naming the option (exit 2), never a traceback or a value the command then trips on."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = ["MAX_NOTE", "finite", "note", "port", "whole"]

MAX_NOTE = 1000  # characters of an audited note or reason (copied into every row it covers)


def note(text: str) -> str:
    """An audited note: at most :data:`MAX_NOTE` characters (a bulk action copies it into
    each of its audit rows and outcome reasons)."""
    if len(text) > MAX_NOTE:
        raise argparse.ArgumentTypeError(f"a note of {len(text):,} characters; at most "
                                         f"{MAX_NOTE:,}")
    return text


def port(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535."""
    if not (text.isascii() and text.isdigit()) or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0 to 65535)")
    return int(text)


def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """A whole number from ``low`` (to ``high``)."""
    def parse(text: str) -> int:
        t = text.strip()
        ok = t.isascii() and t.lstrip("-").isdigit()
        if not ok or int(t) < low or (high is not None and int(t) > high):
            span = f"from {low:,} to {high:,}" if high is not None else f"of at least {low:,}"
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number {span}")
        return int(t)

    parse.__name__ = "whole number"
    return parse


def finite(low: float | None = None) -> Callable[[str], float]:
    """A finite number (not nan or inf), at least ``low`` when given."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or (low is not None and value < low):
            more = f" of at least {low:g}" if low is not None else ""
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number{more}")
        return value

    parse.__name__ = "number"
    return parse
