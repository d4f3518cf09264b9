"""Save-time endpoint validation: good endpoints pass, each kind of bad config is named."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from postbacks.core.endpoint import Endpoint, EndpointConfig, SigningSecret
from postbacks.core.endpoint_check import endpoint_problems, sample_delivery
from postbacks.core.render import render

NOW_MS = 1_700_000_000_000
KEY = SigningSecret("s1", b"k" * 32, 0)


def _ep(
    provider: str = "v3", url: str = "https://pub.example/hook", **config: Any,
) -> Endpoint:
    return Endpoint("ep_1", "app_1", url, frozenset({"conversion"}), provider=provider,
                    secrets=(KEY,), config=EndpointConfig.from_json(config))


@pytest.mark.parametrize("ep", [
    _ep(),
    _ep(schema_version=2, fields=["conversion_id", "currency"], aliases={"currency": "cur"}),
    _ep(validator={"kind": "json_field", "field": "status", "op": "not_equals",
                   "value": "error"}),
    _ep("v2", "https://pub.example/cb?cid={conversion_id}&g={goal_id}&p={snapshot.sub_id}"),
    _ep("v2", "http://pub.example:8080/cb/{app_id}?{{literal}}"),
    _ep("partner", fields=["conversion_id", "payout_usd"], aliases={"payout_usd": "amount"}),
    replace(_ep(), secrets=()),  # secrets are added after the endpoint is saved
], ids=["v3", "v3-v2-fields", "v3-json-validator", "v2", "v2-escapes", "partner", "no-secret"])
def test_good_endpoints_have_no_problems(ep: Endpoint) -> None:
    assert endpoint_problems(ep, now_ms=NOW_MS) == []


@pytest.mark.parametrize(("ep", "problem"), [
    (_ep(url="not a url"), "URL scheme must be http or https, not ''"),
    (_ep(url="ftp://pub.example/x"), "URL scheme must be http or https, not 'ftp'"),
    (_ep(url="https:///path"), "URL has no host"),
    (_ep(url="http://[::1/x"), "URL does not parse"),
    (_ep("v9"), "unknown provider 'v9' (known: partner, v2, v3)"),
    (_ep("v2", "https://pub.example/cb?x={payout}"), "unknown macro {payout}"),
    (_ep("v2", "https://pub.example/cb?x={payout_usd"), "malformed template"),
    (_ep("v2", "https://{app_id}.pub.example/cb"), "not the host"),
    (_ep(fields=["nope"]), "field 'nope' is not in schema version 1"),
    (_ep(schema_version=3), "unknown schema_version 3"),
    (_ep(aliases={"app_id": "conversion_id"}), "would both be sent as 'conversion_id'"),
    (_ep(headers={"webhook-signature": "x"}), "may not override"),
    (_ep(provider_options={"x": 1}), "does not accept option(s): x"),
    (_ep(validator={"kind": "regex"}), "unknown validator 'regex'"),
    (_ep(validator={"kind": "body_matches", "pattern": "("}), "not a valid regex"),
    (_ep(validator={"kind": "json_field", "op": "equals"}), "json_field needs a 'field'"),
    (_ep("partner", schema_version=2), "sends schema version 1 fields only"),
    (replace(_ep(), config_error="unknown endpoint config key(s): x"), "config does not parse"),
    (replace(_ep(), event_types=frozenset()), "subscribes to no event types"),
])
def test_bad_endpoints_are_refused_with_a_clear_problem(ep: Endpoint, problem: str) -> None:
    problems = endpoint_problems(ep, now_ms=NOW_MS)
    assert any(problem in p for p in problems), problems
    assert len(problems) == len(set(problems))


def test_url_problems_are_reported_once_even_when_the_provider_checks_too() -> None:
    problems = endpoint_problems(_ep("v2", "ftp://pub.example/{app_id}"), now_ms=NOW_MS)
    assert problems == ["URL scheme must be http or https, not 'ftp'"]


def test_sample_delivery_renders_through_the_real_path() -> None:
    ep = _ep("v2", "https://pub.example/cb?s={snapshot.sub_id}&e={event_type}")
    req = render(sample_delivery(ep, now_ms=NOW_MS), ep, now_ms=NOW_MS)
    assert req.url == "https://pub.example/cb?s=sample&e=conversion"


@pytest.mark.parametrize("url", ["https://a..b.example.com/cb",
                                 "https://" + "a" * 64 + ".example.com/cb",
                                 "https://xn--zz-.example.com/cb"])
def test_a_host_name_idna_refuses_is_a_problem_on_save(url: str) -> None:
    from postbacks.core.providers.base import url_problems

    assert any("is not a valid DNS name" in p for p in url_problems(url)), url


@pytest.mark.parametrize("url", ["https://{snapshot.sub}.example.com/cb",
                                 "https://bücher.example/cb", "http://[::1]:8080/x",
                                 "https://1.2.3.4/cb?x={conversion_id}"])
def test_templated_idn_and_literal_hosts_stay_valid(url: str) -> None:
    from postbacks.core.providers.base import url_problems

    assert url_problems(url) == []


@pytest.mark.parametrize(("headers", "problem"), [
    # saved, then dropped by every HTTP client when sending; or not sendable by some
    ({"Host": "other.example"}, "'Host' is set by the HTTP client"),
    ({"Content-Length": "5"}, "'Content-Length' is set by the HTTP client"),
    ({"X-Name": "café"}, "'X-Name' has a non-ASCII character"),
])
def test_headers_being_saved_are_refused_when_the_client_sets_or_cannot_send_them(
        headers: dict[str, str], problem: str) -> None:
    from postbacks.core.providers.base import saved_header_problems

    assert any(problem in p for p in saved_header_problems(headers))
    assert saved_header_problems({"X-Api-Key": "k", "Authorization": "Bearer t"}) == []


def test_a_header_saved_before_the_save_check_still_renders() -> None:
    ep = _ep(headers={"X-Name": "café", "Connection": "close"})
    assert render(sample_delivery(ep, now_ms=NOW_MS), ep, now_ms=NOW_MS).headers["X-Name"] == "café"


def test_redact_fields_must_name_fields_the_requests_carry() -> None:
    """A typo in redact_fields would leave the field it meant unmasked in the attempt log:
    refused on save, naming what the requests do carry."""
    assert endpoint_problems(_ep(schema_version=2, fields=["conversion_id", "currency"],
                                 redact_fields=["currency"]), now_ms=NOW_MS) == []
    query = _ep("v2", "https://pub.example/cb?cid={conversion_id}&email={snapshot.sub_id}",
                redact_fields=["email"])
    assert endpoint_problems(query, now_ms=NOW_MS) == []
    typo = _ep(schema_version=2, fields=["conversion_id", "currency"],
               redact_fields=["curency", "currency"])
    [problem] = endpoint_problems(typo, now_ms=NOW_MS)
    assert problem.startswith("redact_fields names 'curency', which this endpoint's requests "
                              "do not carry"), problem
    assert "currency" in problem.split("they carry: ")[1]
