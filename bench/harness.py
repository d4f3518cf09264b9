"""What the benchmarks share: fresh topics per run, the stage environment, CPU accounting of
process trees, percentiles, a dispatch-record writer, and the fast local receiver.
Traffic to 127.0.0.1 only."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Producer

from postbacks.codec import codec_for
from postbacks.core.endpoint import Endpoint
from postbacks.core.fanout import plan_deliveries
from postbacks.core.outcomes import make_attempt, make_outcome
from postbacks.core.providers.base import RenderedRequest
from postbacks.db.connect import scratch_database as db_scratch
from postbacks.db.migrate import migrate
from postbacks.emit import synthetic_conversions
from postbacks.records import AttemptRecord, DeliveryRecord, OutcomeRecord
from postbacks.settings import Settings, load_settings
from postbacks.tools.procs import free_port, http_json, metrics_page, wait_for
from topics import TOPICS
from topics.admin import create_topics, delete_prefixed_topics

ROOT = Path(__file__).resolve().parents[1]

@contextlib.contextmanager
def scratch_database(base_url: str, suffix: str,
                     statements: Iterable[str] = ()) -> Iterator[str]:
    """A new database beside ``base_url``'s (``<name>_<suffix>``), migrated as shipped and
    then changed by ``statements``; its URL. Dropped on exit: the figures of the engine
    parts depend on how much the database holds, and a database every run adds to grows
    by three rows per delivery."""
    with db_scratch(base_url, suffix) as url:
        migrate(url)
        with psycopg.connect(url, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)
        yield url


def stop_on_signals() -> None:
    """SIGTERM (and SIGINT, even in a background job) stop a bench as Ctrl-C does: through
    its context managers, so no stage it started is left running and no scratch database
    or topic is left behind."""
    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)


def say(msg: str) -> None:
    print(f"[bench] {msg}", flush=True)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of ``pid`` and of each of its children (PostgreSQL's work is done in
    its backends, not in the postmaster)."""
    out = {pid: cpu_s(pid)}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                out[int(stat.parent.name)] = (int(fields[11]) + int(fields[12])) / \
                    os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return out


def broker_partitions(s: Settings) -> int:
    """How many partitions the broker holds (old test topics count too)."""
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": s.kafka_bootstrap_servers}).list_topics(timeout=10)
    return sum(len(t.partitions) for t in md.topics.values())


def own_cpu_s() -> float:
    """CPU seconds of this process, every thread (librdkafka's too)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def tree_cpu_since(pid: int, before: dict[int, float]) -> float:
    """CPU seconds the tree spent since ``before`` (children that started since count from
    zero; any that ended meanwhile are missed)."""
    return sum(v - before.get(p, 0.0) for p, v in tree_cpu(pid).items())


def metrics_of(log_path: Path) -> str:
    """The agent's own counters, read from its /metrics (port from its log)."""
    text = metrics_page(log_path)
    if text is None:
        return "(no metrics address in log)"
    return "\n".join(line for line in text.splitlines()
                     if line.startswith(("webhook_", "postbacks_")) and "bucket" not in line)


_STALE: set[str] = set()


def service_pids() -> dict[str, int]:
    """The local broker's and PostgreSQL's PIDs (deploy/local/services.sh), when the pid
    file names a running process of that name: a file left by a crash names none, and
    that service's CPU is then not counted (said once)."""
    out: dict[str, int] = {}
    for name, path, needle in (("kafka", ROOT / ".local" / "run" / "kafka.pid", b"kafka"),
                               ("postgres", ROOT / ".local" / "pgdata" / "postmaster.pid",
                                b"postgres")):
        try:
            pid = int(path.read_text().split()[0])
            alive = needle in Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            alive = False
            pid = 0
        if alive:
            out[name] = pid
        elif path.exists() and name not in _STALE:
            _STALE.add(name)
            print(f"[bench] {path} names no running {name} process: its CPU is not counted",
                  flush=True)
    return out


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] if s else float("nan")


_CREATED: list[Settings] = []


def fresh(base: Settings, name: str) -> Settings:
    """Settings with a fresh topic prefix, its topics created (deleted by ``cleanup``)."""
    s = load_settings({}, kafka_bootstrap_servers=base.kafka_bootstrap_servers,
                      database_url=base.database_url,
                      kafka_replication=base.kafka_replication,
                      kafka_replication_factor=base.kafka_replication_factor,
                      kafka_min_insync_replicas=base.kafka_min_insync_replicas,
                      topic_prefix=f"bench{int(time.time())}{name}.",
                      instance_id=f"bench-{name}")
    create_topics(s)
    _CREATED.append(s)
    return s


def cleanup() -> None:
    """Delete the topics ``fresh`` created: a broker keeping hundreds of old benchmark
    partitions spends CPU on them in every later run."""
    while _CREATED:
        s = _CREATED.pop()
        delete_prefixed_topics(s, s.topic_prefix)


def env_for(s: Settings, **extra: str) -> dict[str, str]:
    return {"KAFKA_BOOTSTRAP_SERVERS": s.kafka_bootstrap_servers,
            "POSTBACKS_DATABASE_URL": s.database_url, "POSTBACKS_TOPIC_PREFIX": s.topic_prefix,
            "POSTBACKS_KAFKA_REPLICATION": s.kafka_replication,
            "POSTBACKS_KAFKA_REPLICATION_FACTOR": str(s.kafka_replication_factor),
            "POSTBACKS_KAFKA_MIN_INSYNC_REPLICAS": str(s.kafka_min_insync_replicas),
            "POSTBACKS_ALLOW_LOOPBACK_TARGETS": "true", "POSTBACKS_CONFIG_REFRESH_S": "2",
            "POSTBACKS_INSTANCE_ID": s.instance_id, **extra}


def send_record(p: Producer, topic: str, value: bytes, key: bytes | None, **kw: Any) -> None:
    """Hand one record to ``p``, serving delivery reports while its queue is full."""
    while True:
        try:
            p.produce(topic, value, key, **kw)
            return
        except BufferError:
            p.poll(0.05)


Prepared = tuple[str, list[str], bytes, bytes]
"""A record planned and encoded for :class:`DispatchWriter`: idempotency key, topics,
value, key."""


class DispatchWriter:
    """Delivery records straight onto dispatch.v1, through one producer for the whole run.

    ``seed`` picks the conversions: every call that must yield new deliveries needs its own
    (the same seed gives the same conversion ids, hence the same deliveries and keys)."""

    def __init__(self, s: Settings, linger_ms: int = 20) -> None:
        self.s = s
        self.codec = codec_for("Delivery")
        self.p = Producer({"bootstrap.servers": s.kafka_bootstrap_servers,
                           "linger.ms": linger_ms, "partitioner": "murmur2_random",
                           "enable.idempotence": True})  # in order across retries

    def send(self, endpoints: list[Endpoint], per_endpoint: int, *, seed: int = 1,
             partition: int | None = None, flush: bool = True,
             also_deliveries: bool = False) -> dict[str, int]:
        """Returns idempotency key -> the moment its record was handed to the producer.

        ``also_deliveries``: each record goes to deliveries.v1 too, as fan-out writes it
        (the sink records the delivery from there), before its dispatch.v1 copy."""
        return self.produce(self.records(endpoints, per_endpoint, seed=seed,
                                         also_deliveries=also_deliveries),
                            partition=partition, flush=flush)

    def records(self, endpoints: list[Endpoint], per_endpoint: int, *, seed: int = 1,
                also_deliveries: bool = False) -> Iterator[Prepared]:
        """The records :meth:`send` produces, each planned and encoded as it is asked for:
        (idempotency key, topics, value, key). ``list()`` them to prepare a backlog before a
        timed window, so that the window holds only the producing, not the load
        generator's planning and encoding (fan-out's work in the real pipeline)."""
        s = self.s
        topics = [s.topic(TOPICS.dispatch.base)]
        if also_deliveries:
            topics.insert(0, s.topic(TOPICS.deliveries.base))
        for d in planned_deliveries(endpoints, per_endpoint * len(endpoints), seed=seed,
                                    namespace=s.instance_id,
                                    idem_key=s.idempotency_key.reveal().encode()):
            yield d["idempotency_key"], topics, self.codec.encode(d), d["endpoint_id"].encode()

    def produce(self, records: Iterable[Prepared], *,
                partition: int | None = None, flush: bool = True) -> dict[str, int]:
        """Produce prepared records; returns idempotency key -> the moment each was handed
        to the producer."""
        keys: dict[str, int] = {}
        kw: dict[str, Any] = {} if partition is None else {"partition": partition}
        for idem, topics, value, key in records:
            keys[idem] = int(time.time() * 1000)
            for topic in topics:
                send_record(self.p, topic, value, key, **kw)
        if flush:
            assert self.p.flush(60) == 0
        else:
            self.p.poll(0)
        return keys

    def close(self) -> None:
        assert self.p.flush(60) == 0


def produce_dispatch(s: Settings, endpoints: list[Endpoint], per_endpoint: int) -> None:
    writer = DispatchWriter(s)
    writer.send(endpoints, per_endpoint)
    writer.close()


def arrived(url: str, keys: Any) -> bool:
    """Whether the receiver has answered every one of ``keys`` (one ``/_times`` read)."""
    times = http_json(f"{url}/_times")
    return all(k in times for k in keys)


def endpoints_for(s: Settings, seeded: list[Any]) -> list[Endpoint]:
    return [Endpoint(x.endpoint_id, x.app_id, x.url, frozenset({"*"})) for x in seeded]


@contextlib.contextmanager
def fast_receiver(*args: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``bench/fast_receiver.py`` on a free port (extra ``args``: a slow endpoint and its
    delay), ready; yields its base URL and process, stopped on exit."""
    port = free_port()
    rx = subprocess.Popen([sys.executable, str(ROOT / "bench" / "fast_receiver.py"), str(port),
                           *args])
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: http_json(f"{url}/_stats"), 20, what="fast receiver")
        yield url, rx
    finally:
        rx.terminate()
        rx.wait(10)


SIGNED_BODY = b'{"schema_version":1,"type":"conversion","data":{"x":"' + b"a" * 540 + b'"}}'


def planned_deliveries(endpoints: list[Endpoint], n: int, *, seed: int, namespace: str,
                       idem_key: bytes) -> Iterator[DeliveryRecord]:
    """n deliveries planned by fan-out's own code from synthetic conversions, one per
    conversion, to ``endpoints`` in turn (each conversion takes its endpoint's app)."""
    for i, ev in enumerate(synthetic_conversions(n, apps=1, seed=seed, namespace=namespace,
                                                 now_ms=int(time.time() * 1000))):
        ep = endpoints[i % len(endpoints)]
        ev["app_id"] = ep.app_id
        yield from plan_deliveries(ev, [ep], idem_key=idem_key, now_ms=int(time.time() * 1000))


def delivered_records(n: int, seed: int, namespace: str, n_endpoints: int = 50,
                      ) -> Iterator[tuple[DeliveryRecord, AttemptRecord, OutcomeRecord]]:
    """n (Delivery, Attempt, Outcome) records of delivered postbacks, as the stages make
    them (:func:`planned_deliveries`), each attempt carrying a realistic signed request
    (~600-byte body)."""
    url = "https://example.test/hook"
    eps = [Endpoint(f"ep_{namespace}_{i}", f"app_{namespace}_{i}", url, frozenset({"*"}))
           for i in range(n_endpoints)]
    now = int(time.time() * 1000)
    for d in planned_deliveries(eps, n, seed=seed, namespace=namespace, idem_key=b"k" * 32):
        req = RenderedRequest("POST", url, {
            "content-type": "application/json", "user-agent": "postbacks/1",
            "webhook-id": d["idempotency_key"], "webhook-timestamp": str(now // 1000),
            "webhook-signature": "v1,abc", "idempotency-key": d["idempotency_key"],
            "postback-attempt": "1"}, SIGNED_BODY)
        a = make_attempt(d, now_ms=now, result="delivered", req=req, status=200,
                         queue_ms=3.5, platform_ms=0.4, wire_ms=1.2, excerpt=b'{"ok":true}')
        yield d, a, make_outcome(d, "delivered", now_ms=now + 1)
