"""Fixtures shared by the tiers. Unit and contract tests use none of the service fixtures.

Integration and end-to-end tests need a real Kafka broker and a real PostgreSQL. They are
found through KAFKA_BOOTSTRAP_SERVERS / POSTBACKS_DATABASE_URL (`make test` starts both with
deploy/local/services.sh and exports them). When those are unset and a Docker engine is
reachable, testcontainers starts them. Otherwise the tests FAIL with how to start the
services: a missing service is never a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from postbacks.settings import Settings, load_settings
from postbacks.tools.procs import Proc

ROOT = Path(__file__).resolve().parents[1]


def _docker_reachable() -> bool:
    if not shutil.which("docker"):
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# The services these tests start or find are one development broker: replication 1 / 1
# (POSTBACKS_KAFKA_REPLICATION=dev), unless the environment names a mode of its own. Set in
# this process's environment too, for the commands the tests run in it or start from it.
os.environ.setdefault("POSTBACKS_KAFKA_REPLICATION", "dev")
REPLICATION = {"POSTBACKS_KAFKA_REPLICATION": os.environ["POSTBACKS_KAFKA_REPLICATION"]}


@pytest.fixture(scope="session")
def service_env() -> Iterator[dict[str, str]]:
    kafka = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    db = os.environ.get("POSTBACKS_DATABASE_URL")
    if kafka and db:
        yield {"KAFKA_BOOTSTRAP_SERVERS": kafka, "POSTBACKS_DATABASE_URL": db, **REPLICATION}
        return
    if _docker_reachable():
        from testcontainers.kafka import KafkaContainer  # type: ignore[import-not-found]
        from testcontainers.postgres import PostgresContainer  # type: ignore[import-not-found]

        with KafkaContainer("apache/kafka:4.1.1") as k, PostgresContainer("postgres:16") as p:
            url = p.get_connection_url().replace("postgresql+psycopg2://", "postgresql://")
            yield {"KAFKA_BOOTSTRAP_SERVERS": k.get_bootstrap_server(),
                   "POSTBACKS_DATABASE_URL": url, **REPLICATION}
        return
    pytest.fail(
        "integration/e2e tests need Kafka and PostgreSQL: run `make test` (which starts them "
        "with deploy/local/services.sh), or set KAFKA_BOOTSTRAP_SERVERS and "
        "POSTBACKS_DATABASE_URL",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def migrated(service_env: dict[str, str]) -> dict[str, str]:
    from postbacks.db.migrate import migrate

    migrate(service_env["POSTBACKS_DATABASE_URL"])
    return service_env


@pytest.fixture()
def namespace() -> str:
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture()
def settings(migrated: dict[str, str], namespace: str) -> Iterator[Settings]:
    """Settings with a fresh topic prefix (fresh topics and consumer groups) per test.

    The test's topics are deleted afterwards: a broker holding every test's partitions
    runs out of file descriptors (3 per partition) long before the suite ends.
    """
    from topics.admin import create_topics, delete_prefixed_topics

    s = load_settings(
        migrated, topic_prefix=f"{namespace}.", instance_id=namespace,
        allow_loopback_targets=True, consumer_session_timeout_ms=6000,
        anomaly_global_key=namespace,  # the shared database holds every test's global rows
    )
    create_topics(s)
    yield s
    if os.environ.get("POSTBACKS_TEST_KEEP_TOPICS"):  # to read them after a failure
        print(f"(kept {s.topic_prefix}* topics)")
        return
    try:
        delete_prefixed_topics(s, s.topic_prefix)
    except Exception as exc:  # the broker may be down at the end of a failure test
        print(f"(could not delete {s.topic_prefix}* topics: {exc})")


@pytest.fixture()
def own_database(settings: Settings, namespace: str) -> Iterator[str]:
    """A migrated database of the test's own (dropped afterwards), for tests whose processes
    act on the whole database -- the monitor's gap count and auto-disable, the gate's held
    depth -- and must neither see nor touch other tests' rows."""
    import psycopg

    from postbacks.db.migrate import migrate

    name = f"pb_own_{namespace}"
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = settings.database_url.rsplit("/", 1)[0] + f"/{name}"
    migrate(url)
    yield url
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                     " WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


@pytest.fixture()
def stack_env(settings: Settings) -> dict[str, str]:
    return {
        "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers,
        "POSTBACKS_DATABASE_URL": settings.database_url,
        "POSTBACKS_KAFKA_REPLICATION": settings.kafka_replication,
        "POSTBACKS_TOPIC_PREFIX": settings.topic_prefix,
        "POSTBACKS_ALLOW_LOOPBACK_TARGETS": "true",
        "POSTBACKS_CONSUMER_SESSION_TIMEOUT_MS": "6000",
        "POSTBACKS_CONFIG_REFRESH_S": "1",
        "POSTBACKS_STALL_RESTART_S": "45",
        "POSTBACKS_ANOMALY_GLOBAL_KEY": settings.anomaly_global_key,
        "POSTBACKS_ANOMALY_REFRESH_S": "0.5",
    }


@pytest.fixture()
def stack(stack_env: dict[str, str], namespace: str, request: pytest.FixtureRequest) -> Iterator:
    from postbacks.tools.procs import Stack

    log_dir = ROOT / ".local" / "test-logs" / namespace
    st = Stack(stack_env, log_dir)
    yield st
    failed = getattr(request.node, "rep_call", None)
    counts: dict[str, str] = {}
    if failed is not None and failed.failed:  # which stage stopped: its counters, while up
        counts = {name: _counters(proc) for name, proc in st.procs.items()}
    st.stop_all()
    if failed is not None and failed.failed:
        for proc in st.procs.values():
            print(f"\n----- {proc.name} (last lines of {proc.log_path}) -----\n{proc.tail(60)}")
            print(f"----- {proc.name} counters at the failure -----\n{counts.get(proc.name)}")


def _counters(proc: Proc) -> str:
    """A stage's ``postbacks_*`` counters from its /metrics."""
    try:
        text = proc.metrics(timeout=3)
    except OSError as exc:
        return f"(metrics unreadable: {exc})"
    if text is None:
        return "(no metrics address in its log)"
    lines = [line for line in text.splitlines() if line.startswith("postbacks_")
             and not any(x in line for x in ("_bucket", "_created", "gc_pause"))
             and not line.endswith(" 0.0")]
    return "\n".join(lines) or "(every postbacks_* counter is 0)"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator:
    rep = yield
    if rep.when == "call":
        item.rep_call = rep  # type: ignore[attr-defined]
    return rep


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in {"unit", "contract", "integration", "e2e"}:
            item.add_marker(getattr(pytest.mark, tier))
