"""Response validators: what a 2xx from a given publisher actually means.

Some publishers answer failures with ``200`` (an empty body, or ``{"status": "error"}``),
so "2xx" alone cannot be trusted everywhere. Each endpoint resolves one validator
(:func:`effective_validator`): its own ``config.validator``, else its provider's default,
else ``status_only``. The validators are a registry, like providers; a spec is checked
with :func:`spec_problems` when the endpoint is saved.

=================  ===================================================================
``status_only``    passes any 2xx (the default; no parameters)
``non_empty_body`` passes when the body is non-blank after stripping whitespace
``body_matches``   ``{"pattern": <regex>}``; passes when ``regex.search`` finds it in the
                   body (decoded UTF-8, undecodable bytes replaced)
``json_field``     ``{"field": "a.b", "op": "exists"|"equals"|"not_equals",
                   "value": <json>}``; the body must be a JSON object. ``op`` defaults
                   to ``exists``; ``equals``/``not_equals`` need ``value`` and fail when
                   the field is missing (absence is not evidence of success). A path
                   segment of digits also indexes a JSON array.
=================  ===================================================================

:func:`check_response` judges only the body of a 2xx: classifying non-2xx statuses
(retryable or permanent) is the classifier's business and happens first. A failed
validation is ``validation_failed``, never a transient retry. A spec that is invalid at
run time (stored before validation existed) fails every response with the reason, so a
broken validator holds deliveries visibly rather than passing them silently.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import orjson
import regex

from postbacks.core.endpoint import Endpoint, ValidatorSpec
from postbacks.core.providers import get_provider, provider_names

__all__ = [
    "VALIDATORS",
    "Validator",
    "check_response",
    "effective_validator",
    "spec_problems",
    "validator_kinds",
]

Params = Mapping[str, Any]
_OPS = ("exists", "equals", "not_equals")
_MISSING = object()


@dataclass(frozen=True, slots=True)
class Validator:
    kind: str
    doc: str
    params: frozenset[str]  # accepted parameter names
    check: Callable[[Params, bytes], str | None]  # None = passes, else the reason
    problems: Callable[[Params], list[str]]


def _no_problems(params: Params) -> list[str]:
    return []


def _status_only(params: Params, body: bytes) -> str | None:
    return None


def _non_empty_body(params: Params, body: bytes) -> str | None:
    return None if body.strip() else "empty body"


def _body_matches_problems(params: Params) -> list[str]:
    pattern = params.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        return ["body_matches needs a non-empty 'pattern'"]
    try:
        regex.compile(pattern)
    except regex.error as exc:
        return [f"body_matches pattern is not a valid regex: {exc}"]
    return []


# The receiver chooses the body a pattern runs on, in the agent's event loop: a pattern
# that backtracks (``(a|aa)+$``) on a body made for it could hold every lane for seconds.
# The search stops after this long, and the response fails validation, saying why.
MATCH_TIMEOUT_S = 0.05


def _body_matches(params: Params, body: bytes) -> str | None:
    pattern: str = params["pattern"]
    try:
        found = regex.search(pattern, body.decode("utf-8", errors="replace"),
                             timeout=MATCH_TIMEOUT_S)
    except TimeoutError:
        return (f"body_matches gave up after {MATCH_TIMEOUT_S * 1000:.0f} ms on a "
                f"{len(body):,}-byte body: pattern {pattern!r} backtracks too much")
    if found:
        return None
    return f"body does not match {pattern!r}"


def _json_field_problems(params: Params) -> list[str]:
    problems: list[str] = []
    path = params.get("field")
    if not isinstance(path, str) or not all(path.split(".")):
        problems.append("json_field needs a 'field' like 'status' or 'result.code'")
    op = params.get("op", "exists")
    if op not in _OPS:
        problems.append(f"json_field op must be one of {', '.join(_OPS)}, not {op!r}")
    elif op == "exists" and "value" in params:
        problems.append("json_field 'value' is only used with op equals/not_equals")
    elif op != "exists" and "value" not in params:
        problems.append(f"json_field op {op} needs a 'value'")
    return problems


def _lookup(doc: Any, path: str) -> Any:
    for seg in path.split("."):
        if isinstance(doc, dict) and seg in doc:
            doc = doc[seg]
        elif isinstance(doc, list) and seg.isdigit() and int(seg) < len(doc):
            doc = doc[int(seg)]
        else:
            return _MISSING
    return doc


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality: ``true`` never equals ``1``; ``1`` equals ``1.0``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


# The receiver's JSON shown in a reason: bounded in depth and length (a plain repr of a
# value nested a thousand deep raised RecursionError, and the delivery was lost as an
# internal error with no attempt recorded).
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring = 4, 8, 8, 60


def _short(value: Any) -> str:
    text = _SHORT.repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _json_field(params: Params, body: bytes) -> str | None:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "body is not JSON"
    if not isinstance(doc, dict):
        return "body is not a JSON object"
    path: str = params["field"]
    op = params.get("op", "exists")
    actual = _lookup(doc, path)
    if actual is _MISSING:
        return f"json field {path} missing"
    if op == "equals" and not _json_equal(actual, params["value"]):
        return f"json field {path} is {_short(actual)}, expected {_short(params['value'])}"
    if op == "not_equals" and _json_equal(actual, params["value"]):
        return f"json field {path} equals {_short(actual)}"
    return None


VALIDATORS: Mapping[str, Validator] = MappingProxyType({
    v.kind: v
    for v in (
        Validator("status_only", "Any 2xx passes.", frozenset(), _status_only, _no_problems),
        Validator("non_empty_body", "2xx with a non-blank body.", frozenset(),
                  _non_empty_body, _no_problems),
        Validator("body_matches", "2xx whose body matches a regex.", frozenset({"pattern"}),
                  _body_matches, _body_matches_problems),
        Validator("json_field", "2xx whose JSON body has a field (equal to / not a value).",
                  frozenset({"field", "op", "value"}), _json_field, _json_field_problems),
    )
})


def validator_kinds() -> list[str]:
    """Registered validator kinds (the valid values of ``validator.kind``)."""
    return list(VALIDATORS)


def spec_problems(spec: ValidatorSpec) -> list[str]:
    """Problems with a validator spec ([] = fine): unknown kind, bad or unknown params."""
    validator = VALIDATORS.get(spec.kind)
    if validator is None:
        return [f"unknown validator {spec.kind!r} (known: {', '.join(VALIDATORS)})"]
    unknown = sorted(set(spec.params) - validator.params)
    problems = [f"validator {spec.kind} does not take {k!r}" for k in unknown]
    return problems + validator.problems(spec.params)


def check_response(spec: ValidatorSpec, status: int, body: bytes) -> str | None:
    """``None`` if a 2xx response passes ``spec``, else a short reason.

    Call it only for 2xx: non-2xx is classified (retry / permanent) before validation.
    Given a non-2xx anyway, it fails with that as the reason rather than passing.
    """
    if not 200 <= status <= 299:
        return f"status {status} is not 2xx"
    problems = spec_problems(spec)
    if problems:
        return "invalid validator config: " + "; ".join(problems)
    try:
        return VALIDATORS[spec.kind].check(spec.params, body)
    except (RecursionError, MemoryError, ValueError, TypeError) as exc:
        # The receiver's body is what the check walks: one it cannot judge fails it, with
        # a reason, rather than ending the delivery as an internal error.
        return f"body could not be judged by {spec.kind}: {type(exc).__name__}"


def effective_validator(endpoint: Endpoint) -> ValidatorSpec:
    """The endpoint's own validator, else its provider's default, else ``status_only``."""
    if endpoint.config.validator is not None:
        return endpoint.config.validator
    if endpoint.provider in provider_names():
        default = get_provider(endpoint.provider).default_validator
        if default is not None:
            return default
    return ValidatorSpec()
