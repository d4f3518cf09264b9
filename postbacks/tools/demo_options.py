"""The demo's options: what ``postbacks demo`` takes, checks, and sets for the processes it
starts (:mod:`postbacks.tools.demo` runs it)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from postbacks.errors import ConfigError
from postbacks.settings import Settings

__all__ = ["QUARANTINED", "DemoOptions", "breaker_threshold", "demo_env", "demo_replication",
           "validate"]

QUARANTINED = 2  # the dead endpoint's breaker opens this many attempts before the last


@dataclass(frozen=True)
class DemoOptions:
    count: int = 2000  # healthy conversions (x endpoints_per_app deliveries)
    apps: int = 10
    endpoints_per_app: int = 3
    flaky: int = 20
    dead: int = 10
    dead_attempts: int = 3
    cohort: int = 25
    replay: int = 20
    rate: float = 0.0
    namespace: str | None = None
    keep_console: bool = False
    start_services: bool = True
    report_json: str | None = None
    timeout_s: float | None = None


def breaker_threshold(o: DemoOptions) -> int:
    return o.dead * o.dead_attempts - QUARANTINED


def validate(o: DemoOptions) -> None:
    for name in ("count", "apps", "endpoints_per_app", "flaky", "dead", "cohort", "replay"):
        if getattr(o, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1")
    if o.dead_attempts < 2:
        raise ConfigError("--dead-attempts must be >= 2 (a retry before the dead letter)")
    if breaker_threshold(o) <= o.flaky:
        raise ConfigError(
            f"the breaker threshold ({o.dead} dead x {o.dead_attempts} attempts - {QUARANTINED}"
            f" = {breaker_threshold(o)}) must be above --flaky ({o.flaky}): the flaky endpoint"
            " fails that many first attempts in a row; raise --dead or lower --flaky")
    if o.replay > o.count * o.endpoints_per_app:
        raise ConfigError("--replay must not exceed the healthy deliveries")


def demo_env(o: DemoOptions, namespace: str) -> dict[str, str]:
    """The settings of the demo's processes that differ from the product defaults."""
    return {
        "POSTBACKS_RETRY_BASE_S": "1",  # default 5: retries after 1 s, 2 s, 4 s ...
        "POSTBACKS_BREAKER_FAILURE_THRESHOLD": str(breaker_threshold(o)),  # default 20
        "POSTBACKS_BREAKER_OPEN_S": "1",  # default 300
        "POSTBACKS_BREAKER_RAMP_S": "1",  # default 300
        "POSTBACKS_CONFIG_REFRESH_S": "1",  # default 5
        "POSTBACKS_ANOMALY_REFRESH_S": "0.5",  # default 2
        # the demo's own global anomaly scope: a halt another run left on the deployment's
        # global scope does not hold its deliveries
        "POSTBACKS_ANOMALY_GLOBAL_KEY": f"demo-{namespace}",
    }


def demo_replication(settings: Settings) -> Settings:
    """The demo runs on the local development broker: replication 1 / 1
    (``POSTBACKS_KAFKA_REPLICATION=dev``) unless the environment names a mode itself."""
    if "POSTBACKS_KAFKA_REPLICATION" in os.environ:
        return settings
    return replace(settings, kafka_replication="dev")
