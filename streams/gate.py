"""Gate stage: deliveries.v1 -> dispatch.v1 or held.v1, through the Faust anomaly gate.

See :mod:`streams.anomaly_gate.runner` for the processing guarantee and
``postbacks.core.anomaly`` for the rules. With no ``payout_anomaly_settings`` rows every
detector reads as off and every delivery is dispatched (the payouts are still counted,
so arming a detector later finds its baseline ready).
"""

from __future__ import annotations

import threading

from postbacks.errors import ServiceUnavailable
from postbacks.kafka.clients import check_broker
from postbacks.settings import Settings
from topics import TOPICS

__all__ = ["run_gate"]

_NEEDED = (TOPICS.deliveries, TOPICS.dispatch, TOPICS.held, TOPICS.outcomes, TOPICS.dlq,
           TOPICS.anomaly_partials, TOPICS.anomaly_control)


def _check_topics(settings: Settings) -> None:
    """Faust's send to a missing topic hangs without an error: refuse to start instead."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap_servers,
                         "client.id": "postbacks-admin"})
    present = set(admin.list_topics(timeout=10).topics)
    missing = [settings.topic(t.base) for t in _NEEDED if settings.topic(t.base) not in present]
    if missing:
        raise ServiceUnavailable(
            f"gate: missing topic(s) {', '.join(missing)}: run `postbacks topics create`"
        )


def run_gate(settings: Settings, stop: threading.Event) -> None:
    check_broker(settings)
    _check_topics(settings)
    from streams.anomaly_gate.refresh import Refresher

    refresher = Refresher.load(settings)  # PostgreSQL missing -> ServiceUnavailable, exit 2

    async def main() -> None:
        from streams.anomaly_gate.runner import GateProcess

        await GateProcess(settings, refresher).run(stop)

    import sys

    import uvloop

    # Faust's consumer runs on a thread of its own and hands each fetch to the agents'
    # thread; with the default 5 ms switch interval either can wait that long for the GIL
    # at every hand-off. 1 ms: p99 added latency 42/38/71/75 ms against 44/38/105/105 ms
    # in alternating pairs (bench/gate.py), max 54-100 ms against 66-149 ms.
    sys.setswitchinterval(settings.gate_switch_interval_s)
    uvloop.run(main())
