"""A missing broker or database at start: one clear line naming it and how to start it,
exit code 2, no traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from postbacks.settings import Settings


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "postbacks", *args], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args", [["fanout"], ["agent"], ["gate"], ["topics", "verify"]],
                         ids=" ".join)
def test_missing_broker(args: list[str], migrated: dict[str, str]) -> None:
    r = _run(args, KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1",
             POSTBACKS_DATABASE_URL=migrated["POSTBACKS_DATABASE_URL"])
    assert r.returncode == 2, r.stderr
    assert "Kafka is not reachable at 127.0.0.1:1" in r.stderr
    assert "make services-up" in r.stderr and "Traceback" not in r.stderr
    # the one line, not librdkafka's log of every refused reconnect (~10 a second)
    assert "Connection refused" not in r.stderr, r.stderr


@pytest.mark.parametrize("args", [["migrate"], ["sink"], ["fanout"]])
def test_missing_database(args: list[str], migrated: dict[str, str]) -> None:
    r = _run(args, KAFKA_BOOTSTRAP_SERVERS=migrated["KAFKA_BOOTSTRAP_SERVERS"],
             POSTBACKS_DATABASE_URL="postgresql://postbacks@127.0.0.1:1/postbacks")
    assert r.returncode == 2, r.stderr
    assert "PostgreSQL is not reachable at postgresql://postbacks@127.0.0.1:1" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_setting_is_a_clear_error() -> None:
    r = _run(["migrate"], POSTBACKS_ENDPOINT_CONCURRENCY="lots")
    assert r.returncode == 2
    assert "POSTBACKS_ENDPOINT_CONCURRENCY='lots' is not a valid int" in r.stderr


def test_a_stage_with_a_bad_gc_threshold_stops_with_a_clear_error() -> None:
    r = _run(["agent"], POSTBACKS_GC_GEN0_THRESHOLD="5")
    assert r.returncode == 2, r.stderr
    assert "POSTBACKS_GC_GEN0_THRESHOLD must be between 100 and 1000000" in r.stderr
    assert "Traceback" not in r.stderr


def test_gate_without_its_database_or_topics_is_a_clear_error(settings: Settings) -> None:
    """The gate must know its modes and halts before it consumes anything."""
    r = _run(["gate"], KAFKA_BOOTSTRAP_SERVERS=settings.kafka_bootstrap_servers,
             POSTBACKS_TOPIC_PREFIX=settings.topic_prefix,
             POSTBACKS_DATABASE_URL="postgresql://postbacks@127.0.0.1:1/postbacks")
    assert r.returncode == 2, r.stderr
    assert "PostgreSQL is not reachable" in r.stderr and "Traceback" not in r.stderr
    r = _run(["gate"], KAFKA_BOOTSTRAP_SERVERS=settings.kafka_bootstrap_servers,
             POSTBACKS_TOPIC_PREFIX=f"missing{settings.topic_prefix}",
             POSTBACKS_DATABASE_URL=settings.database_url)
    assert r.returncode == 2, r.stderr
    assert f"missing topic(s) missing{settings.topic_prefix}deliveries.v1" in r.stderr
    assert "postbacks topics create" in r.stderr and "Traceback" not in r.stderr


def test_a_url_the_driver_refuses_is_one_line_without_its_password() -> None:
    r = _run(["migrate"], POSTBACKS_DATABASE_URL="postgresql://u:hunter2@127.0.0.1:1/x?foo=bar")
    assert r.returncode == 2, r.stderr
    assert "invalid URI query parameter" in r.stderr and "u:***@" in r.stderr
    assert "hunter2" not in r.stderr + r.stdout and "Traceback" not in r.stderr


def test_metrics_port_in_use_is_one_line(migrated: dict[str, str]) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = _run(["relay"], POSTBACKS_METRICS_PORT=str(port), **migrated)
    assert r.returncode == 2, r.stderr
    assert f"POSTBACKS_METRICS_PORT={port}: cannot serve /metrics" in r.stderr
    assert "Traceback" not in r.stderr
