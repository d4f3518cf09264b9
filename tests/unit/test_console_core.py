"""Pure parts of the replay console: edit overrides, filters, sessions and CSRF tokens."""

from __future__ import annotations

import json

import pytest

from postbacks.core.endpoint import Endpoint, EndpointConfig
from postbacks.core.override import (
    MAX_OVERRIDE_BYTES,
    OverrideError,
    apply_override,
    override_diff,
    parse_override,
)
from postbacks.core.render import render
from replay_console.auth import check_csrf, cli_principal, create_token, csrf_for, session_cookie
from replay_console.queries import FilterError, parse_filter
from tests.unit.factories import make_delivery

EP = Endpoint("ep_1", "app_1", "https://pub.example/hook", frozenset({"*"}),
              config=EndpointConfig.from_json({"fields": ["conversion_id", "payout_usd"]}))


def test_override_parses_url_fields_and_aliases() -> None:
    o = parse_override('{"url": " https://fixed.example/h ", "fields": ["conversion_id"],'
                       ' "aliases": {"conversion_id": "cid"}}')
    assert o is not None and o.url == "https://fixed.example/h"
    assert o.fields == ("conversion_id",) and dict(o.aliases or {}) == {"conversion_id": "cid"}
    assert json.loads(o.to_json()) == {"url": "https://fixed.example/h",
                                       "fields": ["conversion_id"],
                                       "aliases": {"conversion_id": "cid"}}
    assert parse_override(None) is None and parse_override("") is None


@pytest.mark.parametrize(("raw", "words"), [
    ("{", "not JSON"),
    ("[]", "must be a JSON object"),
    ('{"method": "GET"}', "unknown override key(s): method"),
    ("{}", "changes nothing"),
    ('{"url": ""}', "url must be a non-empty string"),
    ('{"url": 5}', "url must be a non-empty string"),
    ('{"fields": "a,b"}', "fields must be a list"),
    ('{"fields": [""]}', "fields must be a list"),
    ('{"aliases": {"a": 1}}', "aliases must be an object"),
    ('{"url": "https://x/' + "a" * 3000 + '"}', "longer than 2048"),
    ('{"url": "https://x/", "fields": ["' + "f" * MAX_OVERRIDE_BYTES + '"]}',
     f"larger than {MAX_OVERRIDE_BYTES} bytes"),
    ("[" * 3000 + "]" * 3000, "nested too deeply"),  # fits the size, beats the parser
])
def test_bad_overrides_are_refused_with_the_reason(raw: str, words: str) -> None:
    with pytest.raises(OverrideError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_override(raw)


def test_apply_changes_only_this_copy_and_diff_shows_what_changes() -> None:
    o = parse_override({"url": "https://fixed.example/h", "aliases": {"payout_usd": "amount"}})
    assert o is not None
    edited = apply_override(EP, o)
    assert edited.url == "https://fixed.example/h" and EP.url == "https://pub.example/hook"
    assert edited.config.fields == ("conversion_id", "payout_usd")  # not overridden: kept
    assert dict(edited.config.aliases) == {"payout_usd": "amount"}
    assert [w for w, _a, _b in override_diff(EP, o)] == ["url", "aliases"]
    same = parse_override({"url": EP.url})
    assert same is not None and override_diff(EP, same) == []


def test_an_overridden_render_goes_to_the_new_url_with_the_new_keys() -> None:
    from postbacks.core.endpoint import SigningSecret

    ep = Endpoint("ep_1", "app_1", "https://pub.example/hook", frozenset({"*"}),
                  secrets=(SigningSecret("s", b"k" * 32, 0),))
    o = parse_override({"url": "https://fixed.example/h",
                        "fields": ["conversion_id", "payout_usd"],
                        "aliases": {"payout_usd": "amount"}})
    d = make_delivery(endpoint_id="ep_1")
    req = render(d, apply_override(ep, o), now_ms=1_800_000_000_000)
    body = json.loads(req.body)
    assert req.url == "https://fixed.example/h"
    data = body.get("data", body)
    assert "amount" in data and "payout_usd" not in data and "app_id" not in data


def test_filters_parse_and_refuse_bad_values() -> None:
    f = parse_filter({"app": "app_1", "status": "dead_lettered", "since": "2026-11-01",
                      "until": "2026-11-30T12:00:00Z", "limit": "20",
                      "cursor": "1795997274179:dlv_x"})
    assert f.app == "app_1" and f.status == "dead_lettered" and f.limit == 20
    assert f.cursor == (1795997274179, "dlv_x")
    assert f.since_ms is not None and f.until_ms is not None and f.since_ms < f.until_ms
    for params, words in [
        ({"status": "bogus"}, "status must be one of"),
        ({"since": "yesterday"}, "since must be a date"),
        ({"limit": "0"}, "limit must be"),
        ({"limit": "abc"}, "limit must be"),
        ({"cursor": "nope"}, "cursor is malformed"),
        ({"app": "a b"}, "not a valid id"),
        ({"since": "2026-11-30", "until": "2026-11-01"}, "since must be before until"),
        ({"colour": "red"}, "unknown filter"),
    ]:
        with pytest.raises(FilterError, match=words):
            parse_filter(params)


def test_session_cookie_and_csrf_are_bound_to_the_key_and_the_session() -> None:
    key, other = b"k" * 32, b"o" * 32
    cookie = session_cookie(key, "tok_1", now_s=1000.0)
    token = csrf_for(key, cookie)
    assert check_csrf(key, cookie, token)
    assert not check_csrf(key, cookie, None) and not check_csrf(key, cookie, "")
    assert not check_csrf(other, cookie, token)
    assert not check_csrf(key, session_cookie(key, "tok_2", now_s=1000.0), token)


@pytest.mark.parametrize(("name", "words"), [
    ("", "must name"), ("  ", "must name"), ("a\nadmin:root", "control characters"),
    ("x" * 101, "at most 100"), ("cli:alice", "may not begin with 'cli:'"),
])
def test_token_names_are_audit_actors_and_never_a_commands(name: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        create_token(None, name=name, role="support", created_by="test")  # type: ignore[arg-type]


def test_a_command_is_audited_apart_from_the_token_of_the_same_name() -> None:
    assert cli_principal(" alice ", "support").actor == "support:cli:alice"


def test_held_resolution_takes_the_longest_actor_a_token_or_a_command_may_have() -> None:
    from replay_console.auth import MAX_NAME, Principal
    from replay_console.held import selection_problem

    for actor in (Principal("t", "n" * MAX_NAME, "reviewer", ()).actor,
                  cli_principal("n" * MAX_NAME, "admin").actor):
        assert selection_problem(["dlv_1"], endpoint=None, reason=None, app=None,
                                 all_=False, actor=actor) is None
