"""One frozen settings object, read from ``POSTBACKS_*`` environment variables once.

Entry points call :func:`load_settings` and pass the result down; nothing else in the
package reads the environment. A bad value is a :class:`ConfigError` naming the variable,
raised before any service is touched.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import re
import socket
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from postbacks.core.event_types import EVENT_TYPES
from postbacks.core.ssrf import parse_networks
from postbacks.errors import ConfigError
from postbacks.settings_limits import validate_limits

__all__ = ["Secret", "Settings", "env_name", "load_settings", "parse_event_type_limits",
           "redact_url"]


@dataclass(frozen=True, slots=True)
class Secret:
    """A string that never prints itself (logs, reprs, tracebacks)."""

    value: str = field(repr=False)

    def __repr__(self) -> str:
        return "Secret('**********')"

    def __str__(self) -> str:
        return "**********"

    def reveal(self) -> str:
        return self.value


# Development-only defaults. `postbacks demo` and the tests use them; production must set
# POSTBACKS_IDEMPOTENCY_KEY and POSTBACKS_SECRETS_KEY (see docs/operators.md).
_DEV_IDEMPOTENCY_KEY = "dev-only-idempotency-key-change-me"
_DEV_SECRETS_KEY = "ZGV2LW9ubHktc2VjcmV0cy1rZXktMzItYnl0ZXMhIT0="


@dataclass(frozen=True, slots=True)
class Settings:
    """Every tunable of every stage. Field docs are the settings reference (README)."""

    kafka_bootstrap_servers: str = "127.0.0.1:19092"
    kafka_compression: str = "none"  # the stages' producers: none, lz4, zstd, snappy, gzip
    # Replication of every topic the product creates (the registry's and the gate's
    # changelogs; docs/operators.md "Replication"): "cluster" = 3 replicas with
    # min.insync.replicas 2, so an acknowledged record survives the loss of any one broker
    # and producing goes on while one is down; "dev" = 1 and 1, for a single development
    # broker (deploy/local/services.sh, the demo, the tests and CI select it explicitly).
    kafka_replication: str = "cluster"
    kafka_replication_factor: int = 0  # replicas per partition; 0 = the mode's (3 or 1)
    kafka_min_insync_replicas: int = 0  # min.insync.replicas; 0 = the mode's (2 or 1)
    # Every producer's acks. Only "all" is accepted: the producers are idempotent (and the
    # stages' transactional), which Kafka allows only with acks=all, and an ack must mean
    # "on min.insync.replicas brokers", not "on the leader".
    kafka_acks: str = "all"
    database_url: str = "postgresql://postbacks@127.0.0.1:15432/postbacks"
    topic_prefix: str = ""
    instance_id: str = field(default_factory=lambda: socket.gethostname())
    metrics_port: int = 0
    # Where /metrics listens: 127.0.0.1 on a shared host; 0.0.0.0 in a container or pod
    # that Prometheus scrapes from outside (deploy/k8s, deploy/compose.yaml).
    metrics_host: str = "127.0.0.1"
    idempotency_key: Secret = field(default_factory=lambda: Secret(_DEV_IDEMPOTENCY_KEY))
    secrets_key: Secret = field(default_factory=lambda: Secret(_DEV_SECRETS_KEY))
    allow_loopback_targets: bool = False
    deny_networks: str = ""  # CIDRs refused as targets beside the built-in ranges
    http_timeout_s: float = 10.0
    # The agent's HTTP client: h1 (own), aiohttp or httpx (docs/decisions/0001-http-client.md).
    http_client: str = "h1"
    endpoint_concurrency: int = 4
    batch_size: int = 500
    config_refresh_s: float = 5.0
    consumer_session_timeout_ms: int = 10_000
    log_level: str = "INFO"
    avro_codec: str = "c"  # "c" (postbacks/avro_c.pyx) or "fastavro" (docs/decisions/0002)
    # Retry schedule (see core/retry.py and docs/receivers.md "Retries").
    retry_base_s: float = 5.0
    retry_max_delay_s: float = 6 * 3600.0
    retry_ceiling_s: float = 24 * 3600.0
    retry_max_attempts: int = 50
    retry_max_attempts_by_event_type: str = ""  # "superseded=1,progress=5"
    failing_after: int = 3  # emit a `failing` outcome at this many failed attempts
    # Per-endpoint isolation (see core/breaker.py and streams/lanes.py).
    breaker_failure_threshold: int = 20
    breaker_open_s: float = 300.0
    notify_breaker_open_s: float = 900.0  # breaker.open_long after this long (notifier)
    breaker_ramp_s: float = 300.0
    endpoint_budget_s: float = 30.0  # divert when an endpoint's backlog needs longer to drain
    endpoint_max_queue: int = 2000  # and never buffer more than this per endpoint
    quarantine_delay_s: float = 30.0  # over-budget deliveries come back after this
    max_buffered: int = 5000  # per agent: consumption pauses above this many unfinished
    # the agent's transaction cadence: each commit writes markers to every partition its
    # records touched; at 900 conversions/s, 300 ms against 100 lowered the pipeline's p99
    # in 10 of 12 alternating pairs (docs/performance.md, "The agent's transaction cadence")
    commit_interval_ms: int = 300
    # fan-out/notifier batch: what arrives this long after its first record, one transaction
    # (0 = one per fetch); measured in docs/performance.md, "The fan-out's batch"
    batch_within_ms: int = 20
    # retry.backoff.ms of every stage's transactional producer. A transaction begun right
    # after the previous commit finds the coordinator still writing that commit's markers
    # and is told CONCURRENT_TRANSACTIONS; librdkafka waits retry.backoff.ms (default 100)
    # before asking again, so every transaction paid ~100 ms in send_offsets_to_transaction
    # (measured, docs/performance.md). The Java client waits 20 ms there (KAFKA-5477).
    # Other retries back off exponentially from it up to retry.backoff.max.ms (1 s).
    txn_retry_backoff_ms: int = 10
    stall_restart_s: float = 120.0  # a Kafka call stuck this long restarts the process
    # The agent records an intent before every request (core/intents.py): every request
    # sent is in the attempt log, also when the agent dies before recording its result.
    attempt_intents: bool = True
    # The sink writes an intent with no result after this long as an `unknown` attempt
    # (error class agent_lost); another attempt of the same dispatch on record, or another
    # agent process attempting the delivery after it, does so at once.
    attempt_lost_after_s: float = 600.0
    # Sink: a delivery row waits (in memory, its offset not yet stored) for its first
    # outcome, at most this long, and is then written with its status already projected,
    # which saves rewriting it (through every index of deliveries) a moment later.
    sink_defer_s: float = 10.0
    sink_defer_max: int = 20_000  # ... and at most this many rows wait
    # `postbacks retention` drops the daily attempt partitions older than this
    attempt_retention_days: int = 90
    # `postbacks monitor`: lag and backlog age of every stage's group, and the gap detector
    # (deliveries with no outcome, or none since a release or replay, for this long).
    monitor_interval_s: float = 15.0
    gap_after_s: float = 900.0
    # An endpoint that has only failed for this long is disabled by the monitor (its
    # deliveries parked until `postbacks endpoints enable`); seed 003's 72 h.
    auto_disable_after_s: float = 72 * 3600.0
    # Anomaly gate (modes and thresholds live in payout_anomaly_settings, not here).
    anomaly_refresh_s: float = 2.0  # re-read modes and halts from PostgreSQL this often
    anomaly_global_key: str = "*"  # scope_key of this deployment's global scope rows
    gate_batch_max: int = 500  # deliveries per gate batch (Faust take_events)
    gate_batch_within_s: float = 0.005  # ... or whatever arrived within this long
    gate_commit_interval_s: float = 0.5  # offsets (and the state they cover) this often
    # A partition's cumulative partial goes to the aggregator at most this often (and at
    # every commit, and whenever its window closes); 0 = after every batch.
    gate_partials_interval_s: float = 0.25
    # Python's GIL switch interval in the gate (sys.setswitchinterval): Faust's consumer
    # thread and the agents' thread hand the GIL over at every fetch, and a thread kept
    # waiting the default 5 ms shows in the gate's latency tail.
    gate_switch_interval_s: float = 0.001
    # How long the gate's producer lets dispatch.v1 records wait to share a request: each
    # ms is up to a ms of added latency; 10 instead of 2 took the broker's CPU from 285-290
    # to 213-239 µs per delivery in the whole pipeline (2 runs each, docs/performance.md).
    gate_linger_ms: int = 2
    # Allocations between young-generation garbage collections in every stage process
    # (Python's default is 700). Collections took 4.6 % of the agent's CPU at 700, and with
    # start-up objects frozen (gc.freeze) 0.2 % at 7,000 (docs/performance.md).
    gc_gen0_threshold: int = 10_000
    # Replay console (postbacks console serve; see replay_console).
    console_host: str = "127.0.0.1"
    console_port: int = 8790
    # HMAC key of console session cookies; empty = a random key per process (sessions end
    # when it restarts). Set it (the same on every instance) behind a load balancer.
    console_session_key: Secret = field(default_factory=lambda: Secret(""))
    console_replay_per_app_hour: int = 100  # deliveries re-driven per app per hour (not admin)
    console_bulk_confirm_above: int = 100  # a bulk replay of more needs the count confirmed
    console_bulk_max: int = 50_000  # at most this many deliveries in one bulk replay
    console_replay_rate_per_endpoint: float = 10.0  # replays published per endpoint per second
    console_replay_rate_total: float = 1000.0  # ... and in all
    console_test_sends_per_endpoint: int = 6  # test-sends per endpoint per minute
    console_test_sends_per_user: int = 30  # ... per signed-in user (or token) per minute
    # Proxies (comma-separated IPs or CIDRs) whose X-Forwarded-Proto the console believes
    # (the session cookie's Secure flag, HSTS); empty = believe no one.
    console_trusted_proxies: str = ""

    def topic(self, base: str) -> str:
        """Full topic name for a registry base name (prefix applied)."""
        return f"{self.topic_prefix}{base}"

    @property
    def replication_factor(self) -> int:
        """Replicas per partition of every topic the product creates."""
        return self.kafka_replication_factor or _REPLICATION[self.kafka_replication][0]

    @property
    def min_insync_replicas(self) -> int:
        """``min.insync.replicas`` of every topic the product creates."""
        return self.kafka_min_insync_replicas or _REPLICATION[self.kafka_replication][1]


# The replication modes: (replication factor, min.insync.replicas).
_REPLICATION: dict[str, tuple[int, int]] = {"cluster": (3, 2), "dev": (1, 1)}


_ENV_NAMES: dict[str, str] = {
    "kafka_bootstrap_servers": "KAFKA_BOOTSTRAP_SERVERS",
    "database_url": "POSTBACKS_DATABASE_URL",
}


def env_name(field_name: str) -> str:
    return _ENV_NAMES.get(field_name, f"POSTBACKS_{field_name.upper()}")


def _parse_bool(name: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean (use true/false)")


def load_settings(env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
    """Build :class:`Settings` from ``env`` (default ``os.environ``) plus explicit overrides."""
    source = os.environ if env is None else env
    values: dict[str, object] = {}
    defaults = Settings()
    for f in fields(Settings):
        name = env_name(f.name)
        if name not in source:
            continue
        raw = source[name]
        current = getattr(defaults, f.name)
        try:
            if isinstance(current, bool):
                values[f.name] = _parse_bool(name, raw)
            elif isinstance(current, int):
                values[f.name] = int(raw)
            elif isinstance(current, float):
                number = float(raw)
                if not math.isfinite(number):  # nan passes every comparison below
                    raise ConfigError(f"{name}={raw!r} is not a finite number")
                values[f.name] = number
            elif isinstance(current, Secret):
                if not raw and f.name != "console_session_key":  # (empty: a random key)
                    raise ConfigError(f"{name} must not be empty")
                if f.name == "idempotency_key" and len(raw) < 16:
                    raise ConfigError(f"{name} must be at least 16 characters (a random "
                                      "secret: every idempotency key is derived from it)")
                if f.name == "console_session_key" and raw and len(raw) < 32:
                    # a signed-in user holds its cookie and CSRF token, two HMACs under it:
                    # a short key is guessed offline, and then any session is forged
                    raise ConfigError(f"{name} must be at least 32 characters (a random "
                                      "secret, e.g. openssl rand -base64 32), or unset")
                values[f.name] = Secret(raw)
            else:
                values[f.name] = raw
        except ValueError as exc:
            raise ConfigError(f"{name}={raw!r} is not a valid {type(current).__name__}") from exc
    values.update(overrides)
    settings = Settings(**values)  # type: ignore[arg-type]
    _validate(settings)
    return settings


_COMPRESSION = ("none", "lz4", "zstd", "snappy", "gzip")


def redact_url(url: str) -> str:
    """``url`` with any password (in the authority or a ``password=`` parameter) hidden."""
    url = re.sub(r"(//[^/@:?#]*):.*@", r"\1:***@", url)  # to the last @: a bare one in it
    return re.sub(r"(?i)(password=)[^&#]*", r"\1***", url)


# Positive intervals: at 0 a refresher or committer spins (or Faust waits for a full batch).
_POSITIVE = ("retry_base_s", "retry_max_delay_s", "retry_ceiling_s", "breaker_open_s",
             "breaker_ramp_s", "quarantine_delay_s", "endpoint_budget_s", "stall_restart_s",
             "monitor_interval_s", "gap_after_s", "auto_disable_after_s",
             "console_replay_rate_per_endpoint", "console_replay_rate_total",
             "config_refresh_s", "anomaly_refresh_s", "gate_commit_interval_s",
             "gate_batch_within_s", "attempt_lost_after_s", "notify_breaker_open_s")
_AT_LEAST_ONE = ("retry_max_attempts", "failing_after", "breaker_failure_threshold",
                 "endpoint_max_queue", "max_buffered", "commit_interval_ms", "gate_batch_max",
                 "console_bulk_confirm_above", "console_bulk_max",
                 "console_test_sends_per_endpoint", "console_test_sends_per_user")


def _validate(s: Settings) -> None:
    if s.endpoint_concurrency < 1:
        raise ConfigError("POSTBACKS_ENDPOINT_CONCURRENCY must be >= 1")
    if s.batch_size < 1:
        raise ConfigError("POSTBACKS_BATCH_SIZE must be >= 1")
    if s.http_timeout_s <= 0:
        raise ConfigError("POSTBACKS_HTTP_TIMEOUT_S must be > 0")
    if s.http_client not in ("h1", "aiohttp", "httpx"):
        raise ConfigError(f"POSTBACKS_HTTP_CLIENT={s.http_client!r}: expected one of "
                          "h1, aiohttp, httpx")
    if not s.kafka_bootstrap_servers:
        raise ConfigError("KAFKA_BOOTSTRAP_SERVERS must not be empty")
    if s.kafka_compression not in _COMPRESSION:
        raise ConfigError(f"POSTBACKS_KAFKA_COMPRESSION={s.kafka_compression!r}: expected one of "
                          f"{', '.join(_COMPRESSION)}")
    _validate_replication(s)
    for name in _POSITIVE:
        if getattr(s, name) <= 0:
            raise ConfigError(f"{env_name(name)} must be > 0")
    validate_limits(s)
    for name in _AT_LEAST_ONE:
        if getattr(s, name) < 1:
            raise ConfigError(f"{env_name(name)} must be >= 1")
    _validate_process(s)
    if not 0 <= s.batch_within_ms <= 1000:
        raise ConfigError("POSTBACKS_BATCH_WITHIN_MS must be between 0 and 1000")
    if not 1 <= s.txn_retry_backoff_ms <= 1000:
        raise ConfigError("POSTBACKS_TXN_RETRY_BACKOFF_MS must be between 1 and 1000")
    if not 0 <= s.gate_linger_ms <= 1000:
        raise ConfigError("POSTBACKS_GATE_LINGER_MS must be between 0 and 1000")
    if not 100 <= s.gc_gen0_threshold <= 1_000_000:
        raise ConfigError("POSTBACKS_GC_GEN0_THRESHOLD must be between 100 and 1000000")
    if not 0 < s.gate_switch_interval_s <= 0.1:
        raise ConfigError("POSTBACKS_GATE_SWITCH_INTERVAL_S must be > 0 and <= 0.1")
    if s.sink_defer_s < 0:
        raise ConfigError("POSTBACKS_SINK_DEFER_S must be >= 0 (0 = write at once)")
    if s.attempt_retention_days < 2:
        raise ConfigError("POSTBACKS_ATTEMPT_RETENTION_DAYS must be >= 2 (yesterday's "
                          "attempts are still written)")
    if s.sink_defer_max < 0:
        raise ConfigError("POSTBACKS_SINK_DEFER_MAX must be >= 0")
    if s.gate_partials_interval_s < 0:
        raise ConfigError("POSTBACKS_GATE_PARTIALS_INTERVAL_S must be >= 0")
    if s.console_replay_per_app_hour < 0:
        raise ConfigError("POSTBACKS_CONSOLE_REPLAY_PER_APP_HOUR must be >= 0 (0 = no limit)")
    try:
        parse_networks(s.console_trusted_proxies)
    except ValueError as exc:
        raise ConfigError(f"POSTBACKS_CONSOLE_TRUSTED_PROXIES: {exc}") from None
    parse_event_type_limits(s.retry_max_attempts_by_event_type)
    _validate_database_url(s.database_url)


def _validate_process(s: Settings) -> None:
    """What every process needs to start: ports, log level, instance id, session timeout."""
    if not 1_000 <= s.consumer_session_timeout_ms <= 3_600_000:
        raise ConfigError("POSTBACKS_CONSUMER_SESSION_TIMEOUT_MS must be between 1000 and "
                          "3600000 (and within the brokers' group.min/max.session.timeout.ms)")
    if not 0 <= s.metrics_port <= 65_535:
        raise ConfigError("POSTBACKS_METRICS_PORT must be between 0 (any free port) and 65535")
    try:
        ipaddress.ip_address(s.metrics_host)
    except ValueError:
        raise ConfigError(f"POSTBACKS_METRICS_HOST={s.metrics_host!r} is not an IP address "
                          "(127.0.0.1, or 0.0.0.0 to be scraped from outside)") from None
    if not 1 <= s.console_port <= 65_535:
        raise ConfigError("POSTBACKS_CONSOLE_PORT must be between 1 and 65535")
    if not isinstance(logging.getLevelName(s.log_level.strip().upper()), int):
        raise ConfigError(f"POSTBACKS_LOG_LEVEL={s.log_level!r}: expected one of DEBUG, INFO, "
                          "WARNING, ERROR, CRITICAL")
    if not s.instance_id.strip() or any(c.isspace() for c in s.instance_id):
        raise ConfigError(f"POSTBACKS_INSTANCE_ID={s.instance_id!r} must be a non-empty name "
                          "without spaces (it names this process's transactional ids)")
    if s.avro_codec not in ("c", "fastavro"):
        raise ConfigError(f"POSTBACKS_AVRO_CODEC={s.avro_codec!r}: expected c or fastavro")


def _validate_database_url(url: str) -> None:
    if not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError("POSTBACKS_DATABASE_URL must be a postgresql:// URL")
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # a port that is not a number raises here
    except ValueError as exc:
        raise ConfigError(f"POSTBACKS_DATABASE_URL {redact_url(url)} is not a valid URL: "
                          f"{exc}") from None


def _validate_replication(s: Settings) -> None:
    if s.kafka_replication not in _REPLICATION:
        raise ConfigError(f"POSTBACKS_KAFKA_REPLICATION={s.kafka_replication!r}: expected "
                          "cluster (3 replicas, min.insync.replicas 2) or dev (1 and 1, one "
                          "development broker)")
    if s.kafka_replication_factor < 0 or s.kafka_min_insync_replicas < 0:
        raise ConfigError("POSTBACKS_KAFKA_REPLICATION_FACTOR and "
                          "POSTBACKS_KAFKA_MIN_INSYNC_REPLICAS must be >= 0 (0 = the mode's)")
    if s.min_insync_replicas > s.replication_factor:
        raise ConfigError(f"min.insync.replicas {s.min_insync_replicas} is more than the "
                          f"replication factor {s.replication_factor}: nothing could be "
                          "produced (POSTBACKS_KAFKA_MIN_INSYNC_REPLICAS)")
    if s.kafka_acks.strip().lower() not in ("all", "-1"):
        raise ConfigError(f"POSTBACKS_KAFKA_ACKS={s.kafka_acks!r}: only all is accepted (the "
                          "producers are idempotent and transactional, which needs acks=all)")


def parse_event_type_limits(raw: str) -> dict[str, int]:
    """``"superseded=1, progress=5"`` -> ``{"superseded": 1, "progress": 5}``."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in raw.split(","))):
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or not value.strip().isdigit() or int(value) < 1:
            raise ConfigError(
                f"POSTBACKS_RETRY_MAX_ATTEMPTS_BY_EVENT_TYPE: {part!r} is not <event_type>=<n>"
            )
        if name.strip() not in EVENT_TYPES:
            raise ConfigError(f"POSTBACKS_RETRY_MAX_ATTEMPTS_BY_EVENT_TYPE: {name.strip()!r} "
                              f"is not an event type (known: {', '.join(sorted(EVENT_TYPES))})")
        out[name.strip()] = int(value)
    return out
