"""A three-broker cluster (``services.sh cluster``) under the whole pipeline: kill -9 of one
broker mid-load -- the agent group's coordinator, which also leads partitions -- loses
nothing and delivery goes on within 45 s, with no stage restarted by the stall watchdog;
restarted, it catches up (every partition back to three in-sync replicas). The gate's
start on the fresh cluster logs no ERROR line.

The cluster is this test's own: its own state dir and ports, beside the shared single
broker, started and purged through the project's script; only it is stopped.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from postbacks.emit import ConversionProducer
from postbacks.settings import Settings, load_settings
from postbacks.tools.procs import Stack, wait_for
from streams.agent import GROUP as AGENT_GROUP
from tests.conftest import ROOT
from tests.e2e.harness import Harness
from tests.unit.factories import make_conversion
from topics import all_topics, internal_topics
from topics.admin import create_topics, under_replicated, verify_topics

SERVICES = ROOT / "deploy" / "local" / "services.sh"
ENDPOINTS = 4
RATE = 150  # conversions per second, one delivery each
SECONDS = 20
BAD = re.compile(r" (ERROR|CRITICAL) |Traceback|^%[0-3]\||is overlapping", re.MULTILINE)


def _free_base() -> int:
    """A base port with the six ports after it free (3 brokers x client + controller)."""
    for base in range(39092, 39900, 10):
        try:
            for port in range(base, base + 6):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no six free ports between 39092 and 39900")


class Cluster:
    def __init__(self, state: Path, base: int) -> None:
        self.env = {**os.environ, "POSTBACKS_CLUSTER_STATE_DIR": str(state),
                    "POSTBACKS_CLUSTER_PORT": str(base), "POSTBACKS_SERVICES_TIMEOUT": "120"}
        self.bootstrap = ",".join(f"127.0.0.1:{base + 2 * i}" for i in range(3))

    def run(self, *args: str, timeout: float = 240) -> str:
        r = subprocess.run(["bash", str(SERVICES), "cluster", *args], env=self.env,
                           capture_output=True, text=True, timeout=timeout, check=False)
        assert r.returncode == 0, (f"services.sh cluster {' '.join(args)} failed:\n"
                                   f"{r.stdout}\n{r.stderr}\n{self.logs()}")
        return r.stdout

    def logs(self) -> str:
        r = subprocess.run(["bash", str(SERVICES), "cluster", "logs"], env=self.env,
                           capture_output=True, text=True, timeout=60, check=False)
        return r.stdout


@pytest.fixture()
def cluster(namespace: str) -> Iterator[Cluster]:
    c = Cluster(ROOT / ".local" / "test-cluster" / namespace, _free_base())
    try:
        c.run("up")
        yield c
    finally:
        subprocess.run(["bash", str(SERVICES), "cluster", "down", "--purge"], env=c.env,
                       capture_output=True, timeout=120, check=False)


def _coordinator_of(s: Settings, group: str) -> int:
    """The broker coordinating a stage's consumer group (its offsets and transactions)."""
    admin = AdminClient({"bootstrap.servers": s.kafka_bootstrap_servers})
    desc = admin.describe_consumer_groups([s.topic(group)])[s.topic(group)].result(timeout=30)
    return int(desc.coordinator.id)


def _behind(s: Settings) -> str:
    """Which stage holds what is not delivered yet: every group's lag by topic (records
    between its committed offset and the log's end; the sink's offsets live in PostgreSQL
    and are left out: its progress is the rows counted)."""
    from postbacks.core.backlog import lag_of
    from postbacks.kafka.lag import ProgressReader
    from topics.registry import GROUPS

    lag: dict[str, int] = {}
    for p in ProgressReader(s, GROUPS).read(None):
        if lag_of(p):
            cut = s.topic_prefix
            key = f"{p.group.removeprefix(cut)} on {p.topic.removeprefix(cut)}"
            lag[key] = lag.get(key, 0) + lag_of(p)
    return ", ".join(f"{k}: {v}" for k, v in sorted(lag.items())) or "no group behind"


def _delivered(h: Harness, eps: list[str]) -> int:
    return int(h.scalar("SELECT count(*) FROM deliveries WHERE endpoint_id = ANY(%s)"
                        " AND status = 'delivered'", (eps,)))


@pytest.mark.cluster  # in make test; make test-cluster runs it alone
@pytest.mark.timeout(300)
def test_kill_9_of_a_broker_mid_load_loses_nothing_and_it_catches_up(
    cluster: Cluster, migrated: dict[str, str], namespace: str,
) -> None:
    s = load_settings({**migrated, "KAFKA_BOOTSTRAP_SERVERS": cluster.bootstrap,
                       "POSTBACKS_KAFKA_REPLICATION": "cluster"},
                      topic_prefix=f"{namespace}.", instance_id=namespace,
                      allow_loopback_targets=True, consumer_session_timeout_ms=6000,
                      anomaly_global_key=namespace)
    assert (s.replication_factor, s.min_insync_replicas) == (3, 2)
    create_topics(s)
    assert verify_topics(s) == []  # 3 replicas and min.insync.replicas 2 on every topic
    md = AdminClient({"bootstrap.servers": s.kafka_bootstrap_servers}).list_topics(timeout=10)
    assert len(md.brokers) == 3
    for spec in (*all_topics(), *internal_topics()):
        assert {len(p.replicas) for p in md.topics[s.topic(spec.base)].partitions.values()} \
            == {3}, spec.base

    env = {"KAFKA_BOOTSTRAP_SERVERS": s.kafka_bootstrap_servers,
           "POSTBACKS_DATABASE_URL": s.database_url, "POSTBACKS_KAFKA_REPLICATION": "cluster",
           "POSTBACKS_TOPIC_PREFIX": s.topic_prefix, "POSTBACKS_ALLOW_LOOPBACK_TARGETS": "true",
           "POSTBACKS_CONSUMER_SESSION_TIMEOUT_MS": "6000", "POSTBACKS_CONFIG_REFRESH_S": "1",
           "POSTBACKS_STALL_RESTART_S": "120", "POSTBACKS_ANOMALY_GLOBAL_KEY": namespace,
           "POSTBACKS_ANOMALY_REFRESH_S": "0.5"}
    stack = Stack(env, ROOT / ".local" / "test-logs" / namespace)
    ok = False
    try:
        h = Harness(s, stack, namespace)
        h.start_receiver()
        eps = [h.endpoint(f"k{i}") for i in range(ENDPOINTS)]
        h.start_stages()
        total = RATE * SECONDS
        producer = ConversionProducer(s)
        done = threading.Event()

        def load() -> None:
            t0 = time.monotonic()
            now = int(time.time() * 1000)
            for i in range(total):
                producer.send(make_conversion(
                    event_id=f"evt_{i}", conversion_id=f"cv_{namespace}_{i:06d}",
                    app_id=h.app(f"k{i % ENDPOINTS}"), occurred_at=now,
                    source_created_at=now - 1000, source_completed_at=now - 2000))
                if (ahead := (i + 1) / RATE - (time.monotonic() - t0)) > 0:
                    time.sleep(ahead)
            producer.flush(120)
            done.set()

        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        wait_for(lambda: _delivered(h, eps) >= total // 4, 90, interval=0.2,
                 what=f"a quarter of {total} delivered before the kill")
        gate_log_at_kill = stack.procs["gate"].log_path.read_text(errors="replace")
        # The agent's group coordinator: an offset send waiting for it when it dies hangs in
        # librdkafka (postbacks.kafka.txn), and the broker leads partitions too.
        victim = _coordinator_of(s, AGENT_GROUP)
        cluster.run("kill", str(victim))
        killed_at = time.monotonic()
        before = _delivered(h, eps)
        # 45 s: well inside the stall watchdog's 120 s, so the stages recover on their own
        # (an offset send stuck on the dead coordinator is abandoned after 10 s)
        wait_for(lambda: _delivered(h, eps) >= min(total, before + total // 10), 45,
                 interval=0.2, what="deliveries going on with one broker down")
        print(f"broker {victim} killed: delivery went on "
              f"{time.monotonic() - killed_at:.1f} s later")
        loader.join(timeout=SECONDS + 120)
        assert done.is_set(), "the load did not finish"
        assert producer.failed == [] and producer.acked == total, producer.failed[:3]

        wait_for(lambda: _delivered(h, eps) >= total, 120, interval=0.5,
                 what=f"all {total} delivered",
                 progress=lambda: f"{_delivered(h, eps)} delivered; behind: {_behind(s)}")
        received = h.received()
        ids = {r["webhook_id"] for r in received if r["status"] == 200}
        assert len(ids) == total, f"{len(ids)} distinct deliveries received of {total}"
        assert h.stats()["bad_signatures"] == 0
        assert under_replicated(s), "the killed broker's replicas never left the ISR"

        cluster.run("start", str(victim))
        restarted_at = time.monotonic()
        wait_for(lambda: not under_replicated(s), 120, interval=1.0,
                 what=f"every partition back to 3 in-sync replicas "
                      f"(behind: {under_replicated(s)})")
        print(f"broker {victim} restarted: every partition in sync again "
              f"{time.monotonic() - restarted_at:.1f} s later")
        assert not stack.dead(), f"stages died: {stack.dead()}"
        restarted = [p.name for p in stack.procs.values()
                     if "restarting in place" in p.log_path.read_text(errors="replace")]
        assert not restarted, f"the stall watchdog restarted {restarted}"
        replaced = stack.procs["agent"].log_path.read_text(errors="replace").count(
            "a new transactional producer replaces it")
        print(f"agent producers replaced after a hung offset send: {replaced}")
        bad = [line for line in gate_log_at_kill.splitlines() if BAD.search(line)]
        assert not bad, "the gate's start on a fresh cluster:\n" + "\n".join(bad[:20])
        ok = True
    finally:
        stack.stop_all()
        if not ok:
            for proc in stack.procs.values():
                print(f"\n----- {proc.name} (last lines of {proc.log_path}) -----\n"
                      f"{proc.tail(40)}")
            print(cluster.logs())
