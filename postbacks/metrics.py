"""Prometheus metrics, named after the seeds. Each process serves ``/metrics``.

Label sets are bounded: ``endpoint`` labels appear only on gauges for open breakers.
"""

from __future__ import annotations

import functools
import gc
import logging
import time
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from postbacks.core.anomaly.modes import Detector, HoldReason, Mode
from postbacks.errors import ConfigError
from postbacks.metrics_local import LocalCounter, LocalHistogram

__all__ = [
    "ANOMALY_CUSUM",
    "ANOMALY_ENDPOINT_SPAN_EXPECTED",
    "ANOMALY_ENDPOINT_SPAN_OBSERVED",
    "ANOMALY_ENDPOINT_SPAN_SCORE",
    "ANOMALY_GLOBAL_WATERMARK",
    "ANOMALY_RETRO_BURST",
    "ANOMALY_SIGNALS",
    "ANOMALY_SPAN_EXPECTED",
    "ANOMALY_SPAN_OBSERVED",
    "ANOMALY_SPAN_SCORE",
    "ANOMALY_TRIPS",
    "ATTEMPTS_TOTAL",
    "BACKLOG_AGE",
    "BREAKER_OPEN",
    "CONSUMER_LAG",
    "DATABASE_UP",
    "DEAD_LETTER_REASONS",
    "DELETED_UNREAD",
    "DLQ_TOTAL",
    "ENDPOINTS_DISABLED",
    "ENDPOINT_VIEW_CHECKED",
    "ENDPOINT_VIEW_FAILURES",
    "GAP_DELIVERIES",
    "GAP_OLDEST_AGE",
    "GATE_AGGREGATOR",
    "GATE_BATCH_SECONDS",
    "GATE_DECISIONS",
    "GC_FROZEN",
    "GC_GEN0_THRESHOLD",
    "HALTED_SCOPES",
    "HELD_DEPTH",
    "HELD_OLDEST_AGE",
    "IN_FLIGHT",
    "LATENCY",
    "LOOP_LAG",
    "MISSING_INPUTS",
    "MONITOR_ERRORS",
    "MONITOR_LAST_SUCCESS",
    "NOTIFICATIONS_TOTAL",
    "OUTCOMES_TOTAL",
    "PARTITIONS_AHEAD",
    "PAYOUT_USD",
    "PRODUCERS_REPLACED",
    "QUARANTINED",
    "QUARANTINED_DEPTH",
    "RELAY_PAUSED",
    "RENDER_ERRORS",
    "RETENTION_OVERDUE",
    "RETRODATED",
    "SINK_ROWS",
    "SINK_WAITING",
    "STAGE_RECORDS",
    "TXN_ABORTS",
    "TXN_SECONDS",
    "UNFINISHED",
    "VALIDATION_FAILED",
    "child",
    "serve_metrics",
    "start_series",
]

log = logging.getLogger(__name__)

# Updated for every delivery: plain numbers read at scrape (postbacks.metrics_local).
ATTEMPTS_TOTAL = LocalCounter(
    "webhook_delivery_attempts_total", "HTTP delivery attempts by result", ["result"]
)
LATENCY = LocalHistogram(
    "webhook_delivery_latency_seconds", "Delivery latency split by phase", ["phase"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
# The monitor (postbacks monitor): how far behind each stage's group is.
BACKLOG_AGE = Gauge(
    "webhook_backlog_age_seconds",
    "Age of the oldest record a stage's group has yet to finish, from when it was written "
    "or, on a delay topic, fell due; by group and topic (0 when caught up; grows while the "
    "stage is stalled or down)", ["group", "topic"],
)
DELETED_UNREAD = Gauge(
    "postbacks_records_deleted_unread",
    "Records retention has deleted past a stage group's committed offset, by group and "
    "topic: never read by that group, and lost to it (the monitor's view, while the "
    "stage is down or stuck; 0 otherwise)", ["group", "topic"])
CONSUMER_LAG = Gauge("postbacks_consumer_lag_records",
                     "Records a stage's group has yet to finish, by group, topic and partition",
                     ["group", "topic", "partition"])
GAP_DELIVERIES = Gauge("webhook_gap_deliveries",
                       "Deliveries with no outcome, or none since a release or replay, for "
                       "longer than POSTBACKS_GAP_AFTER_S (the gap detector)")
GAP_OLDEST_AGE = Gauge("webhook_gap_oldest_age_seconds",
                       "How long the oldest gap has been quiet (0 when there is none)")
QUARANTINED_DEPTH = Gauge("webhook_quarantined_depth",
                          "Deliveries whose status is quarantined: diverted, waiting in "
                          "quarantine.v1 or (due over a minute ahead) in a retry tier "
                          "(counted up to 100,000)")
ENDPOINTS_DISABLED = Gauge("webhook_endpoints_disabled",
                           "Endpoints disabled by the platform (auto-disable): their "
                           "deliveries are parked until re-enabled")
PARTITIONS_AHEAD = Gauge("postbacks_partitions_ahead_seconds",
                         "How far ahead of today, in whole days, a daily-partitioned table's "
                         "newest partition reaches (6 while they are made each day; below 0 "
                         "the day's rows go to the default partition, which retention never "
                         "drops)", ["table"])
RETENTION_OVERDUE = Gauge("postbacks_retention_overdue_seconds",
                          "How long the oldest daily partition of a table has been past the "
                          "retention window, in whole days (0: none; a daily retention job "
                          "keeps it at most a day)", ["table"])
MONITOR_LAST_SUCCESS = Gauge("postbacks_monitor_last_success_timestamp_seconds",
                             "When the monitor last completed a round, by check", ["check"])
DATABASE_UP = Gauge("postbacks_database_up",
                    "1 when the monitor's last round read PostgreSQL, 0 when it could not")
MONITOR_ERRORS = Counter("postbacks_monitor_errors_total",
                         "Monitor rounds that failed, by check", ["check"])
DLQ_TOTAL = Counter("webhook_dlq_total", "Records dead-lettered", ["stage", "reason"])
FANOUT_UNROUTED = Counter("postbacks_fanout_unrouted_total",
                          "Conversions no enabled endpoint subscribes to (no delivery made)")
NOTIFICATIONS_TOTAL = Counter(
    "postbacks_notifications_total",
    "Operational notifications by kind and result (sent | aggregated | no_owner)",
    ["kind", "result"],
)
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
# Read at scrape from the agent's lanes (Lanes sets its function).
IN_FLIGHT = Gauge("postbacks_agent_in_flight", "HTTP requests in flight in this agent")
UNFINISHED = Gauge("postbacks_agent_unfinished", "Consumed deliveries not yet finished")
STRICT_WAITING = Gauge("postbacks_agent_strict_waiting",
                       "Deliveries of strict-ordering endpoints held back in memory behind "
                       "followers still coming back (streams/strict.py)")
OUTCOMES_TOTAL = LocalCounter("webhook_outcomes_total", "Outcome events produced", ["kind"])
# Seed 000's webhook.payout.usd: the payout of each delivery once, when it ends (not per
# attempt, so retries do not multiply the dollars); delivered is money that reached the
# publisher, exhausted and dead_lettered money that did not. A support replay counts again.
PAYOUT_USD = LocalCounter("webhook_payout_usd_total",
                          "Payout (USD) of deliveries by how they ended", ["outcome"])
STAGE_RECORDS = Counter("postbacks_stage_records_total", "Records consumed by stage", ["stage"])
PRODUCERS_REPLACED = Counter(
    "postbacks_transactional_producers_replaced_total",
    "Transactional producers abandoned and replaced after an offset send hung", ["stage"])
# Per transaction of a consume-transform-produce stage: the offset send and the commit are
# broker round trips that every batch waits on (and its outputs stay invisible to
# read_committed readers until the commit's markers are written).
TXN_ABORTS = Counter(
    "postbacks_transaction_aborts",
    "Stage transactions aborted and their batch read again, by stage and Kafka error code "
    "(a few at a rebalance or broker restart; a steady stream is an output the broker "
    "refuses every time: a topic deleted, an ACL, a size limit)", ["stage", "code"])
TXN_SECONDS = Histogram(
    "postbacks_transaction_seconds",
    "Time in a stage transaction's broker calls, by stage and step (offsets | commit)",
    ["stage", "step"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
)
SINK_ROWS = Counter("postbacks_sink_rows_total", "Rows written to PostgreSQL", ["table"])
RELAY_PAUSED = Gauge("postbacks_relay_paused_partitions",
                     "Delay-topic partitions the relay holds paused behind a head not yet due")
SINK_WAITING = Gauge("postbacks_sink_waiting_rows",
                     "Delivery rows the sink holds back for their first outcome")

# The anomaly gate (seed 000 §5.11). Endpoint-labelled gauges are exported only for
# endpoints whose value-rate detector is armed (a payout_anomaly_settings row), so the
# label set is bounded by configuration, not by traffic.
ANOMALY_SPAN_OBSERVED = Gauge(
    "postbacks_anomaly_span_observed_usd",
    "Payout in the rolling span ending at the newest event-time minute, by scope and span"
    " (minutes)", ["scope", "span"],
)
ANOMALY_SPAN_EXPECTED = Gauge(
    "postbacks_anomaly_span_expected_usd",
    "Seasonal expectation of the same rolling span, by scope and span (minutes)",
    ["scope", "span"],
)
ANOMALY_RETRO_BURST = Gauge(
    "postbacks_anomaly_retro_burst",
    "The retrodated burst (aggregator instance): retrodated deliveries in the last 15"
    " event-time minutes (observed) and the count that halts the global scope under the"
    " global retrodating row's enforce (threshold)", ["quantity"])
ANOMALY_CUSUM = Gauge(
    "postbacks_anomaly_cusum",
    "The rolling detector's CUSUM statistic (log-likelihood ratio) by scope and arm"
    " (count +50%); the arm trips above h (12.5 by default)", ["scope", "arm"])
ANOMALY_SPAN_SCORE = Gauge(
    "postbacks_anomaly_span_score",
    "Normalized excess of the rolling span, (observed - expected) / sigma, by scope, span"
    " (minutes) and channel (value, count); the span trips above its k", ["scope", "span",
                                                                          "channel"],
)
ANOMALY_ENDPOINT_SPAN_OBSERVED = Gauge(
    "postbacks_anomaly_endpoint_span_observed_usd",
    "Payout in an armed endpoint's rolling span, by endpoint and span (minutes)",
    ["endpoint", "span"],
)
ANOMALY_ENDPOINT_SPAN_EXPECTED = Gauge(
    "postbacks_anomaly_endpoint_span_expected_usd",
    "Seasonal expectation of an armed endpoint's rolling span, by endpoint and span",
    ["endpoint", "span"],
)
ANOMALY_ENDPOINT_SPAN_SCORE = Gauge(
    "postbacks_anomaly_endpoint_span_score",
    "Normalized excess of an armed endpoint's rolling span, (observed - expected) / sigma,"
    " by endpoint, span and channel (value, count); the span trips above its k",
    ["endpoint", "span", "channel"],
)
ANOMALY_TRIPS = Counter("postbacks_anomaly_trips_total", "Halts tripped (closed -> tripped)",
                        ["scope", "detector"])
ANOMALY_SIGNALS = Counter("postbacks_anomaly_signals_total",
                          "Detector signals per delivery, by reason and mode", ["reason", "mode"])
RETRODATED = Counter("webhook_retrodated_total", "Retrodated deliveries seen, by mode", ["mode"])
MISSING_INPUTS = Counter("webhook_missing_anomaly_inputs_total",
                         "Deliveries missing payout or timestamps, by mode", ["mode"])
GATE_DECISIONS = Counter("postbacks_gate_deliveries_total", "Gate decisions", ["decision"])
GATE_BATCH_SECONDS = Histogram(
    "postbacks_gate_batch_seconds", "Gate batch time: decide, produce, acknowledged",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
)
GATE_REFETCHES = Counter(
    "postbacks_gate_refetches_total",
    "Times the gate sought its partitions to their committed offsets again because a seek"
    " overtook a fetch (the batch is dropped and read again) or a hand-over", ["reason"])
GC_PAUSE = Histogram(
    "postbacks_gc_pause_seconds", "Python garbage-collection pauses, by generation",
    ["generation"], buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
)
LOOP_LAG = Histogram(
    "postbacks_event_loop_lag_seconds",
    "How late the asyncio event loop ran a 10-ms timer: the wait every ready callback had",
    ["process"], buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
)
ENDPOINT_VIEW_CHECKED = Gauge(
    "postbacks_endpoint_view_checked_timestamp_seconds",
    "When this process's endpoint view was last known current: the start of its last "
    "successful refresh (a refresh failing, or hanging, keeps the last view and this time)")
ENDPOINT_VIEW_FAILURES = Counter(
    "postbacks_endpoint_view_refresh_failures_total",
    "Endpoint view refreshes that failed (the last view is kept)")
CONTROL_REFUSED = Counter(
    "postbacks_gate_control_refused_total",
    "Halt changes on the anomaly control topic not honoured (dated ahead of the clock, an "
    "unknown detector): written by something other than a gate or `anomaly close`",
    ["reason"])
EXPIRED_UNREAD = Counter(
    "postbacks_records_expired_unread",
    "Records a group never read because retention deleted them first (found when the "
    "group is assigned the partition)", ["group", "topic"])
EXPIRED_LAST = Gauge(
    "postbacks_records_expired_unread_last_timestamp_seconds",
    "When the group last found records retention deleted before it read them",
    ["group", "topic"])
RESTARTS_IN_PLACE = Counter(
    "postbacks_restarts_in_place",
    "Times this process replaced itself with a fresh copy (same PID: an unusable Kafka "
    "client, a stalled call or loop), counted on across the copies")
GC_FROZEN = Gauge("postbacks_gc_frozen_objects",
                  "Start-up objects frozen out of the garbage collector's way (gc.freeze)")
GC_GEN0_THRESHOLD = Gauge("postbacks_gc_gen0_threshold",
                          "Net allocations between young-generation collections")
GATE_AGGREGATOR = Gauge(
    "postbacks_gate_aggregator",
    "1 in the gate instance that owns anomaly.partials.v1 and runs the global roll-up, 0 in"
    " the others (the sum over instances is 1 once the group is stable)")
ANOMALY_GLOBAL_WATERMARK = Gauge(
    "postbacks_anomaly_global_watermark_seconds",
    "Event time (epoch seconds) of the global roll-up's open minute: the payout of every"
    " earlier minute is complete in its rolling state (every active partition has moved"
    " past it). Set in the aggregator instance only")
HALTED_SCOPES = Gauge("postbacks_anomaly_halted_scopes", "Scopes currently tripped", ["scope"])
HELD_DEPTH = Gauge("webhook_held_depth", "Deliveries currently held")
HELD_OLDEST_AGE = Gauge("webhook_held_oldest_age_seconds",
                        "Age of the oldest held delivery, from held_at")

# Replay console.
CONSOLE_REQUESTS = Histogram(
    "postbacks_console_request_seconds", "Console requests by route and status class",
    ["route", "status"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
CONSOLE_ACTIONS = Counter("postbacks_console_actions_total",
                          "Console actions by action and result (ok | refused)",
                          ["action", "result"])
CONSOLE_REPLAYED = Counter("postbacks_console_replays_published_total",
                           "Replayed deliveries published to the retry topics")
CONSOLE_REPLAY_PENDING = Gauge("postbacks_console_replay_pending",
                               "Replayed deliveries queued but not yet published")


# Every reason a stage dead-letters with (DeadLetter.reason), and every halt a gate can trip:
# their series are created at 0 when a process starts, so the first dead letter or trip is
# an increase Prometheus sees (a series born at 1 is invisible to increase()).
DEAD_LETTER_REASONS = ("undecodable", "invalid_record", "missing_field", "render_failed",
                       "permanent", "exhausted", "blocked_address", "invalid_url",
                       "unknown_endpoint",
                       "internal_error", "dead_letter", "too_large")
_TRIP_SCOPES = ("endpoint", "global")


# Every attempt result the agent counts (webhook_delivery_attempts_total): the success
# ratio has no value while "delivered" is missing (an agent failing every attempt since
# its start never paged).
ATTEMPT_RESULTS = ("delivered", "retryable", "permanent", "validation_failed",
                   "render_failed", "blocked_address", "invalid_url")


def start_series(stage: str) -> None:
    """Create the labelled series this stage may later increment, at 0."""
    for reason in DEAD_LETTER_REASONS:
        DLQ_TOTAL.labels(stage=stage, reason=reason)
    if stage == "agent":
        for result in ATTEMPT_RESULTS:
            child(ATTEMPTS_TOTAL, result)
    if stage in ("agent", "gate"):  # both read the control topic's halts
        for why in ("dated_ahead", "unknown_detector"):  # found at start: seen from 0
            CONTROL_REFUSED.labels(why)
    if stage == "gate":
        # a signal counted once per window (a global burst) is seen from its first
        for signal in (*(r.value for r in HoldReason), "retrodated_burst"):
            for mode in (Mode.DETECT, Mode.ENFORCE):
                ANOMALY_SIGNALS.labels(signal, mode.value)
        for scope in _TRIP_SCOPES:
            for detector in Detector:
                ANOMALY_TRIPS.labels(scope, detector.value)


@functools.cache
def child(metric: Any, value: str) -> Any:
    """The labelled child of a one-label metric, cached (``labels()`` costs µs per call)."""
    return metric.labels(value)


@functools.cache
def _watch_gc() -> None:
    """Time every collection (a full one over a big heap stalls the event loop); once."""
    started = [0.0]
    by_gen = [GC_PAUSE.labels(str(g)) for g in range(3)]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            by_gen[info["generation"]].observe(time.perf_counter() - started[0])

    gc.callbacks.append(on_gc)


def serve_metrics(port: int, host: str = "127.0.0.1") -> int:
    """Serve /metrics on host:port (0 = any free port); returns the port. Also starts
    timing garbage collections (``postbacks_gc_pause_seconds``)."""
    _watch_gc()
    try:
        server, _thread = start_http_server(port, addr=host)
    except OSError as exc:  # in use, or not allowed: one line, not a traceback
        raise ConfigError(f"POSTBACKS_METRICS_PORT={port}: cannot serve /metrics on "
                          f"{host}:{port}: {exc.strerror or exc}") from None
    actual = int(server.server_port)
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host  # (where it can be fetched)
    log.info("metrics on http://%s:%d/metrics (listening on %s)", shown, actual, host)
    return actual

