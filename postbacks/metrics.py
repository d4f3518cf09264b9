"""Prometheus metrics, named after the seeds. Each process serves ``/metrics``.

Label sets are bounded: ``endpoint`` labels appear only on gauges for open breakers.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

__all__ = [
    "ATTEMPTS_TOTAL",
    "BACKLOG_AGE",
    "BREAKER_OPEN",
    "DLQ_TOTAL",
    "IN_FLIGHT",
    "LATENCY",
    "OUTCOMES_TOTAL",
    "QUARANTINED",
    "RENDER_ERRORS",
    "SINK_ROWS",
    "STAGE_RECORDS",
    "UNFINISHED",
    "VALIDATION_FAILED",
    "child",
    "observe_backlog",
    "serve_metrics",
]

log = logging.getLogger(__name__)

ATTEMPTS_TOTAL = Counter(
    "webhook_delivery_attempts_total", "HTTP delivery attempts by result", ["result"]
)
LATENCY = Histogram(
    "webhook_delivery_latency_seconds", "Delivery latency split by phase", ["phase"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
BACKLOG_AGE = Gauge(
    "webhook_backlog_age_seconds", "Age of the last record consumed, by topic", ["topic"]
)
DLQ_TOTAL = Counter("webhook_dlq_total", "Records dead-lettered", ["stage", "reason"])
RENDER_ERRORS = Counter("webhook_render_errors_total", "Deliveries that failed to render")
VALIDATION_FAILED = Counter(
    "webhook_validation_failed_total", "2xx responses refused by the endpoint's validator"
)
BREAKER_OPEN = Gauge(
    "webhook_breaker_open", "1 while an endpoint's breaker is open (only open ones exported)",
    ["endpoint"],
)
QUARANTINED = Counter("webhook_quarantined_total", "Deliveries diverted to quarantine",
                      ["reason"])
IN_FLIGHT = Gauge("postbacks_agent_in_flight", "HTTP requests in flight in this agent")
UNFINISHED = Gauge("postbacks_agent_unfinished", "Consumed deliveries not yet finished")
OUTCOMES_TOTAL = Counter("webhook_outcomes_total", "Outcome events produced", ["kind"])
STAGE_RECORDS = Counter("postbacks_stage_records_total", "Records consumed by stage", ["stage"])
SINK_ROWS = Counter("postbacks_sink_rows_total", "Rows written to PostgreSQL", ["table"])


@functools.cache
def child(metric: Any, value: str) -> Any:
    """The labelled child of a one-label metric, cached (``labels()`` costs µs per call)."""
    return metric.labels(value)


def observe_backlog(msg: Any, now_ms: int) -> None:
    """Record how old the record being consumed is (broker timestamp to now)."""
    ts_type, ts = msg.timestamp()
    if ts_type and ts > 0:
        child(BACKLOG_AGE, msg.topic()).set(max(0.0, (now_ms - ts) / 1000))


def serve_metrics(port: int) -> int:
    """Serve /metrics on 127.0.0.1:port (0 = any free port); returns the port."""
    server, _thread = start_http_server(port, addr="127.0.0.1")
    actual = int(server.server_port)
    log.info("metrics on http://127.0.0.1:%d/metrics", actual)
    return actual

