"""Save-time endpoint validation: refuse bad config before it can fail a delivery.

:func:`endpoint_problems` is what the API runs when an endpoint is created or edited
(an empty list = save it). It checks, in order:

1. the stored config parses (``config_error``) and the endpoint subscribes to something,
   every event type known (:mod:`postbacks.core.event_types`, ``*`` for all);
   ``notify_endpoint_id``, when set, names another endpoint (whether it exists is the
   caller's database check);
2. the URL parses, is http(s) and names a host;
3. the provider is registered, and its own ``check_config`` (macros, fields, aliases,
   schema version, headers, options);
4. the effective response validator's spec;
5. only if all of that is clean: a dry render of a sample delivery through the real
   render + sign path, so anything render would still refuse is reported here.

Signing secrets have their own lifecycle (added and rotated after the endpoint row is
saved), so the dry render signs with a throwaway sample key when the endpoint has no
active secret yet; a missing secret is not a config problem. DNS and the SSRF address
check are not done here (they are I/O, done by the caller's adapter).
"""

from __future__ import annotations

from dataclasses import replace

from postbacks.core.endpoint import Endpoint, SigningSecret, active_keys
from postbacks.core.event_types import event_type_problems
from postbacks.core.macros import SNAPSHOT_PREFIX, RenderError, find_macros
from postbacks.core.providers import get_provider, provider_names
from postbacks.core.providers.base import url_problems
from postbacks.core.redact import field_names
from postbacks.core.render import RenderedRequest, render
from postbacks.core.validators import effective_validator, spec_problems
from postbacks.records import ConversionEvent, DeliveryRecord

__all__ = ["endpoint_problems", "sample_delivery"]

_SAMPLE_KEY = SigningSecret("sec_sample", b"sample-signing-key-not-secret!!!", 0)


def _snapshot_keys(template: str) -> list[str]:
    try:
        names = find_macros(template)
    except RenderError:
        return []
    return [n[len(SNAPSHOT_PREFIX):] for n in names if n.startswith(SNAPSHOT_PREFIX)]


def sample_delivery(endpoint: Endpoint, *, now_ms: int) -> DeliveryRecord:
    """A plausible delivery for ``endpoint`` (dry render and test-send).

    Every field has a value, and the snapshot holds a value for each ``snapshot.<key>``
    the URL template uses, so a failure to render is the config's fault, not the sample's.
    """
    snapshot = {"player_id": "player_sample"}
    snapshot.update({key: "sample" for key in _snapshot_keys(endpoint.url)})
    event_type = next(iter(sorted(endpoint.event_types - {"*"})), "conversion")
    conversion = ConversionEvent(
        event_id="evt_sample", conversion_id="cv_sample", app_id=endpoint.app_id,
        event_type=event_type, goal_id="goal_sample", payout_usd_micros=1_250_000,
        source_created_at=now_ms - 120_000, source_completed_at=now_ms - 60_000,
        occurred_at=now_ms, source_snapshot=snapshot, original_amount="1.25",
        original_currency="USD", producer="endpoint_check",
    )
    return DeliveryRecord(
        delivery_id="dlv_sample", endpoint_id=endpoint.endpoint_id,
        idempotency_key="msg_sample", conversion=conversion, created_at=now_ms, attempt=0,
        trigger="test_send", triggered_by=None, due_at=None, enqueued_at=now_ms,
        first_attempt_at=None, hold_reason=None, last_error=None,
    )


def _redact_problems(fields: tuple[str, ...], sample: RenderedRequest) -> list[str]:
    """``redact_fields`` naming a field the endpoint's requests do not carry: a typo would
    leave the field it meant unmasked in the attempt log."""
    carried = field_names(sample)
    unknown = [f for f in fields if f not in carried]
    if not unknown:
        return []
    shown = ", ".join(sorted(carried)[:30]) or "none"
    return [f"redact_fields names {', '.join(repr(f[:60]) for f in unknown[:10])}, which "
            f"this endpoint's requests do not carry (a typo leaves the field it meant "
            f"unmasked); they carry: {shown}"]


def endpoint_problems(endpoint: Endpoint, *, now_ms: int, redact: bool = True) -> list[str]:
    """Everything wrong with ``endpoint``'s configuration, in words for the person saving
    it; ``[]`` means it can be saved. ``redact``: check that ``redact_fields`` name fields
    the requests carry (when they are being saved)."""
    problems: list[str] = []
    if endpoint.config_error:
        problems.append(f"config does not parse: {endpoint.config_error}")
    if not endpoint.event_types:
        problems.append("endpoint subscribes to no event types")
    problems += event_type_problems(endpoint.event_types)
    problems += url_problems(endpoint.url)
    if endpoint.provider in provider_names():
        problems += get_provider(endpoint.provider).check_config(endpoint)
    else:
        problems.append(
            f"unknown provider {endpoint.provider!r} (known: {', '.join(provider_names())})"
        )
    problems += spec_problems(effective_validator(endpoint))
    if endpoint.config.notify_endpoint_id == endpoint.endpoint_id:
        problems.append("notify_endpoint_id names the endpoint itself: its owner must be "
                        "told on a channel that does not depend on it")
    if not problems:
        probe = endpoint
        if not active_keys(endpoint, now_ms):
            probe = replace(endpoint, secrets=(_SAMPLE_KEY,))
        try:
            sample = render(sample_delivery(endpoint, now_ms=now_ms), probe, now_ms=now_ms)
        except RenderError as exc:
            problems.append(f"sample delivery does not render: {exc}")
        else:
            if redact:
                problems += _redact_problems(endpoint.config.redact_fields, sample)
    return list(dict.fromkeys(problems))
