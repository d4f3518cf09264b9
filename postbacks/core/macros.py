"""The one macro registry: what ``{name}`` placeholders mean.

Rendering (URL templates), save-time endpoint validation and the console's macro picker
all read :data:`MACROS`, so the three can never drift apart. A macro resolves a delivery
to a string, or to ``None`` when the delivery has no value for it.

Policy (loud rendering): a placeholder that names no macro (including a macro that was
renamed), a macro that resolves to ``None`` or to a blank string, and malformed braces
all raise :class:`RenderError` — the delivery becomes ``render_failed`` instead of a
postback with a hole in it. ``{{`` and ``}}`` are literal braces.

``snapshot.<key>`` is a family of macros: the raw value of ``<key>`` in the conversion's
write-once ``source_snapshot``. Any key is a known macro; a key missing from a given
snapshot resolves empty (so that delivery fails to render, loudly).

:class:`RenderError` is defined here, at the bottom layer of rendering, so that every
layer above (providers, render) can raise it without an import cycle; its public home is
``postbacks.core.render``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import MappingProxyType

from postbacks.records import DeliveryRecord

__all__ = [
    "MACROS",
    "SNAPSHOT_PREFIX",
    "Macro",
    "RenderError",
    "expand",
    "find_macros",
    "format_usd_micros",
    "get_macro",
    "iso_utc",
    "macro_names",
    "macro_sequence",
]

SNAPSHOT_PREFIX = "snapshot."
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class RenderError(Exception):
    """The delivery cannot be rendered with the endpoint's current config."""


@dataclass(frozen=True, slots=True)
class Macro:
    name: str
    doc: str
    resolve: Callable[[DeliveryRecord], str | None]


def format_usd_micros(micros: int) -> str:
    """Micro-dollars as a decimal string with exactly 6 places (exact integer math)."""
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(micros), 1_000_000)
    return f"{sign}{whole}.{frac:06d}"


def iso_utc(epoch_ms: int) -> str:
    """Epoch milliseconds as UTC ISO-8601 with millisecond precision, e.g.
    ``2023-11-14T22:13:20.000Z``."""
    try:
        t = _EPOCH + timedelta(milliseconds=epoch_ms)
    except OverflowError:  # from another producer: the fan-out refuses such a time
        raise RenderError(f"time {epoch_ms} is outside 0001..9999 (epoch ms)") from None
    # (not strftime: its %Y leaves a year before 1000 unpadded, "1-01-01T...", which no
    # ISO-8601 parser reads)
    return (f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:"
            f"{t.second:02d}.{t.microsecond // 1000:03d}Z")


def _opt_str(value: int | str | None) -> str | None:
    return None if value is None else str(value)


def _payout(d: DeliveryRecord) -> str | None:
    micros = d["conversion"]["payout_usd_micros"]
    return None if micros is None else format_usd_micros(micros)


_ALL = (
    Macro("conversion_id", "The conversion's id.", lambda d: d["conversion"]["conversion_id"]),
    Macro("app_id", "The app (publisher) id.", lambda d: d["conversion"]["app_id"]),
    Macro("event_type", "The event type, e.g. conversion.",
          lambda d: d["conversion"]["event_type"]),
    Macro("goal_id", "The goal id (an event without a goal cannot render it: render_failed).",
          lambda d: d["conversion"]["goal_id"]),
    Macro("payout_usd", "Payout in US dollars, 6 decimal places, e.g. 1.250000.", _payout),
    Macro("payout_usd_micros", "Payout in micro-dollars (integer).",
          lambda d: _opt_str(d["conversion"]["payout_usd_micros"])),
    Macro("occurred_at", "When the event occurred, epoch milliseconds.",
          lambda d: str(d["conversion"]["occurred_at"])),
    Macro("occurred_at_iso", "When the event occurred, UTC ISO-8601.",
          lambda d: iso_utc(d["conversion"]["occurred_at"])),
    Macro("source_completed_at", "When the source completed the conversion, epoch ms.",
          lambda d: _opt_str(d["conversion"]["source_completed_at"])),
    Macro("source_created_at", "When the source created the conversion, epoch ms.",
          lambda d: _opt_str(d["conversion"]["source_created_at"])),
    Macro("idempotency_key", "Opaque key, stable across retries and replays: dedupe on it.",
          lambda d: d["idempotency_key"]),
    Macro("attempt", "The number of this attempt (1 for the first).",
          lambda d: str(d["attempt"] + 1)),
    Macro("endpoint_id", "The endpoint's id.", lambda d: d["endpoint_id"]),
)

MACROS: Mapping[str, Macro] = MappingProxyType({m.name: m for m in _ALL})
"""Every fixed macro by name, in picker order (``snapshot.<key>`` is a family, see
:func:`get_macro`)."""


def macro_names() -> list[str]:
    """Fixed macro names in picker order (the ``snapshot.<key>`` family is not listed)."""
    return list(MACROS)


def get_macro(name: str) -> Macro | None:
    """The macro called ``name`` (fixed, or ``snapshot.<key>``); ``None`` if unknown."""
    macro = MACROS.get(name)
    if macro is not None:
        return macro
    if name.startswith(SNAPSHOT_PREFIX) and len(name) > len(SNAPSHOT_PREFIX):
        key = name[len(SNAPSHOT_PREFIX):]
        return Macro(name, f"Raw source snapshot field {key!r}.",
                     lambda d: d["conversion"]["source_snapshot"].get(key))
    return None


def _parse(template: str) -> list[tuple[bool, str]]:
    """``(is_macro, text)`` parts of ``template``; :class:`RenderError` on bad braces."""
    parts: list[tuple[bool, str]] = []
    literal: list[str] = []
    i, n = 0, len(template)
    while i < n:
        ch = template[i]
        if ch in "{}" and template.startswith(ch * 2, i):
            literal.append(ch)
            i += 2
        elif ch == "}":
            raise RenderError(f"malformed template: unmatched '}}' at position {i}")
        elif ch == "{":
            end = template.find("}", i + 1)
            name = template[i + 1:end] if end != -1 else ""
            if end == -1 or not name or "{" in name:
                raise RenderError(f"malformed template: unclosed or empty '{{' at position {i}")
            if literal:
                parts.append((False, "".join(literal)))
                literal = []
            parts.append((True, name))
            i = end + 1
        else:
            literal.append(ch)
            i += 1
    if literal:
        parts.append((False, "".join(literal)))
    return parts


def find_macros(template: str) -> list[str]:
    """Placeholder names in ``template``, first occurrence order, without repeats.

    Raises :class:`RenderError` on malformed braces. Names are not checked against the
    registry here (see :func:`get_macro`).
    """
    return list(dict.fromkeys(text for is_macro, text in _parse(template) if is_macro))


def macro_sequence(template: str) -> list[str]:
    """Every placeholder of ``template`` in order, repeats included (:class:`RenderError`
    on malformed braces): two templates with the same sequence put the same values in the
    same places."""
    return [text for is_macro, text in _parse(template) if is_macro]


def expand(template: str, d: DeliveryRecord, *, quote: Callable[[str], str]) -> str:
    """``template`` with every ``{name}`` replaced by ``quote(value)``.

    Literal text is left as written (it is the endpoint's own config). Raises
    :class:`RenderError` for an unknown macro, an empty-resolving macro, or bad braces.
    """
    out: list[str] = []
    for is_macro, text in _parse(template):
        if not is_macro:
            out.append(text)
            continue
        macro = get_macro(text)
        if macro is None:
            raise RenderError(f"unknown macro {{{text}}}")
        value = macro.resolve(d)
        if value is None or not value.strip():
            raise RenderError(f"macro {{{text}}} resolved empty")
        out.append(quote(value))
    return "".join(out)
