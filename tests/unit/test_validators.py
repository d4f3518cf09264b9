"""Response validators: each kind passes and fails as documented; specs are checked."""

from __future__ import annotations

from typing import Any

import pytest

from postbacks.core.endpoint import Endpoint, EndpointConfig, ValidatorSpec
from postbacks.core.validators import (
    check_response,
    effective_validator,
    spec_problems,
    validator_kinds,
)


def _spec(kind: str, **params: Any) -> ValidatorSpec:
    return ValidatorSpec(kind, params)


STATUS = _spec("status_only")
NON_EMPTY = _spec("non_empty_body")
MATCHES = _spec("body_matches", pattern=r"conversion_id=\w+")
FIELD_EXISTS = _spec("json_field", field="result.id")
FIELD_OK = _spec("json_field", field="status", op="equals", value="ok")
FIELD_NOT_ERROR = _spec("json_field", field="status", op="not_equals", value="error")


@pytest.mark.parametrize(("spec", "status", "body", "reason"), [
    (STATUS, 200, b"", None),
    (STATUS, 204, b"anything", None),
    (NON_EMPTY, 200, b"cv_123", None),
    (NON_EMPTY, 200, b"", "empty body"),  # Partnerize: 200 + empty body = failure
    (NON_EMPTY, 200, b" \r\n\t", "empty body"),
    (MATCHES, 200, b"ok conversion_id=cv_1", None),
    (MATCHES, 200, b"", r"body does not match 'conversion_id=\\w+'"),
    (MATCHES, 200, b"\xff\xfe conversion_id=x", None),  # undecodable bytes replaced
    (_spec("body_matches", pattern="^OK$"), 200, b"NOT OK", "body does not match '^OK$'"),
    (FIELD_EXISTS, 200, b'{"result": {"id": 0}}', None),
    (FIELD_EXISTS, 200, b'{"result": {"id": null}}', None),
    (FIELD_EXISTS, 200, b'{"result": {}}', "json field result.id missing"),
    (FIELD_EXISTS, 200, b'{"result": "x"}', "json field result.id missing"),
    (FIELD_EXISTS, 200, b"not json", "body is not JSON"),
    (FIELD_EXISTS, 200, b"", "body is not JSON"),
    (FIELD_EXISTS, 200, b"\xff", "body is not JSON"),
    (FIELD_EXISTS, 200, b"[1, 2]", "body is not a JSON object"),
    (FIELD_OK, 200, b'{"status": "ok"}', None),
    (FIELD_OK, 200, b'{"status": "error"}', "json field status is 'error', expected 'ok'"),
    (FIELD_OK, 200, b'{}', "json field status missing"),
    (FIELD_NOT_ERROR, 200, b'{"status": "ok"}', None),
    (FIELD_NOT_ERROR, 200, b'{"status": "error"}', "json field status equals 'error'"),
    (FIELD_NOT_ERROR, 200, b'{"other": 1}', "json field status missing"),
    (_spec("json_field", field="n", op="equals", value=1), 200, b'{"n": true}',
     "json field n is True, expected 1"),
    (_spec("json_field", field="n", op="equals", value=1), 200, b'{"n": 1.0}', None),
    (_spec("json_field", field="a.1.b", op="equals", value=[1, True]), 200,
     b'{"a": [{}, {"b": [1, true]}]}', None),
])
def test_check_response(spec: ValidatorSpec, status: int, body: bytes, reason: str | None) -> None:
    assert check_response(spec, status, body) == reason


@pytest.mark.parametrize("status", [199, 300, 404, 500])
def test_non_2xx_never_passes(status: int) -> None:
    assert check_response(STATUS, status, b"ok") == f"status {status} is not 2xx"


@pytest.mark.parametrize(("spec", "problem"), [
    (_spec("nope"), "unknown validator 'nope'"),
    (_spec("status_only", pattern="x"), "validator status_only does not take 'pattern'"),
    (_spec("body_matches"), "body_matches needs a non-empty 'pattern'"),
    (_spec("body_matches", pattern=""), "body_matches needs a non-empty 'pattern'"),
    (_spec("body_matches", pattern=3), "body_matches needs a non-empty 'pattern'"),
    (_spec("body_matches", pattern="(unclosed"), "not a valid regex"),
    (_spec("json_field"), "json_field needs a 'field'"),
    (_spec("json_field", field="a..b"), "json_field needs a 'field'"),
    (_spec("json_field", field="a", op="gt", value=1), "op must be one of"),
    (_spec("json_field", field="a", op="equals"), "op equals needs a 'value'"),
    (_spec("json_field", field="a", value=1), "only used with op equals/not_equals"),
])
def test_spec_problems(spec: ValidatorSpec, problem: str) -> None:
    problems = spec_problems(spec)
    assert any(problem in p for p in problems), problems
    # a spec that was stored anyway fails every response, visibly
    reason = check_response(spec, 200, b'{"a": 1}')
    assert reason is not None and reason.startswith("invalid validator config")


@pytest.mark.parametrize("spec", [STATUS, NON_EMPTY, MATCHES, FIELD_EXISTS, FIELD_OK,
                                  FIELD_NOT_ERROR, _spec("json_field", field="a", op="exists")])
def test_good_specs_have_no_problems(spec: ValidatorSpec) -> None:
    assert spec_problems(spec) == []
    assert spec.kind in validator_kinds()


def _ep(provider: str, validator: dict[str, Any] | None = None) -> Endpoint:
    config = EndpointConfig.from_json({"validator": validator} if validator else None)
    return Endpoint("ep_1", "app_1", "https://x.test", frozenset({"*"}), provider=provider,
                    config=config)


@pytest.mark.parametrize(("ep", "kind"), [
    (_ep("v3"), "status_only"),
    (_ep("v2"), "status_only"),
    (_ep("partner"), "non_empty_body"),  # the provider's default
    (_ep("partner", {"kind": "body_matches", "pattern": "ok"}), "body_matches"),  # override
    (_ep("v3", {"kind": "non_empty_body"}), "non_empty_body"),
    (_ep("unknown"), "status_only"),
])
def test_effective_validator(ep: Endpoint, kind: str) -> None:
    assert effective_validator(ep).kind == kind


def test_a_backtracking_pattern_on_a_body_made_for_it_gives_up_within_its_time() -> None:
    spec = ValidatorSpec("body_matches", {"pattern": r"^(a|aa)+$"})
    assert check_response(spec, 200, b"a" * 20) is None  # an ordinary body still matches
    reason = check_response(spec, 200, b"a" * 60 + b"b")  # ~1e12 paths for re: hours
    assert reason is not None and "gave up after 50 ms" in reason, reason


@pytest.mark.parametrize("spec", [FIELD_OK, FIELD_NOT_ERROR,
                                  _spec("json_field", field="status", op="not_equals",
                                        value=[[["x"]]])])
def test_a_body_nested_a_thousand_deep_fails_with_a_reason_not_an_exception(
        spec: ValidatorSpec) -> None:
    """The receiver's JSON is shown in the reason: a value nested 1,000 deep made the
    reason's repr raise RecursionError, and the delivery ended as an internal error with no
    attempt recorded."""
    body = b'{"status":' + b"[" * 1000 + b"]" * 1000 + b"}"
    reason = check_response(spec, 200, body)
    if spec is FIELD_OK:
        assert reason is not None and reason.startswith("json field status is [[[["), reason
        assert len(reason) < 200
    else:
        assert reason is None or len(reason) < 200


def test_a_short_reason_bounds_every_shown_value() -> None:
    body = b'{"status":"' + b"x" * 5000 + b'"}'
    reason = check_response(FIELD_OK, 200, body)
    assert reason is not None and len(reason) < 200 and reason.endswith("expected 'ok'")
