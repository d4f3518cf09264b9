"""What a process is told about its environment at start, beyond the errors
:func:`postbacks.settings.load_settings` raises: development keys still in use, and
``POSTBACKS_*`` names nothing reads (a typo keeps a default silently)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import fields

from postbacks.settings import _DEV_IDEMPOTENCY_KEY, _DEV_SECRETS_KEY, Settings, env_name

__all__ = ["dev_keys_in_use", "unknown_names"]


def dev_keys_in_use(s: Settings) -> list[str]:
    """The key settings left at their development defaults (public: in this source)."""
    return [env_name(name) for name, dev in (("idempotency_key", _DEV_IDEMPOTENCY_KEY),
                                            ("secrets_key", _DEV_SECRETS_KEY))
            if getattr(s, name).reveal() == dev]


# POSTBACKS_* names read by the service scripts and the test and bench harness, not here.
_OTHER_NAMES = frozenset({
    "POSTBACKS_KAFKA_PORT", "POSTBACKS_KAFKA_CONTROLLER_PORT", "POSTBACKS_KAFKA_JVM_EXTRA",
    "POSTBACKS_PG_PORT", "POSTBACKS_PG_EXTRA_DBS", "POSTBACKS_SERVICES_TIMEOUT",
    "POSTBACKS_STATE_DIR", "POSTBACKS_CLUSTER_PORT", "POSTBACKS_CLUSTER_STATE_DIR",
    "POSTBACKS_RESTARTS_IN_PLACE",
})


def unknown_names(env: Mapping[str, str]) -> list[str]:
    """``POSTBACKS_*`` names in ``env`` that nothing reads (a typo keeps the default
    silently), each with the setting it most likely meant."""
    known = sorted(env_name(f.name) for f in fields(Settings))
    out = []
    for name in sorted(env):
        if (not name.startswith("POSTBACKS_") or name in known or name in _OTHER_NAMES
                or name.startswith(("POSTBACKS_BENCH_", "POSTBACKS_TEST_"))):
            continue
        # (compared without the prefix every name shares)
        near = difflib.get_close_matches(
            name[10:], [k[10:] for k in known if k.startswith("POSTBACKS_")], n=1)
        out.append(f"{name} (did you mean POSTBACKS_{near[0]}?)" if near else name)
    return out
