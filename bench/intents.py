"""The agent's throughput with and without attempt intents, in one run (bounded; traffic to
127.0.0.1 only).

Each pair runs one agent process over the same backlog of dispatch records (fresh topics
per run) against the same fast receiver, once with ``POSTBACKS_ATTEMPT_INTENTS=false`` and
once with intents (each request waits for its intent's acknowledgement), alternating which
goes first. Prints deliveries/s and CPU µs per delivery of each, and the ratio
with / without per pair and its median.

Usage: flock /tmp/postbacks-bench.lock python bench/intents.py --deliveries 10000 --pairs 3
Needs the services (`make services-up`) and KAFKA_BOOTSTRAP_SERVERS / POSTBACKS_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness
from bench.harness import (
    ROOT,
    cleanup,
    cpu_s,
    endpoints_for,
    env_for,
    fast_receiver,
    produce_dispatch,
    say,
)
from postbacks.db.migrate import migrate
from postbacks.settings import Settings, load_settings
from postbacks.tools.procs import Stack, http_json, wait_for
from postbacks.tools.seed import seed_endpoints
from topics.admin import create_topics


def fresh(base: Settings, name: str) -> Settings:
    """Settings with a fresh topic prefix and the base's replication mode, its topics
    created (deleted by ``cleanup``)."""
    s = load_settings({}, kafka_bootstrap_servers=base.kafka_bootstrap_servers,
                      database_url=base.database_url, kafka_replication=base.kafka_replication,
                      topic_prefix=f"bench{int(time.time())}{name}.",
                      instance_id=f"bench-{name}")
    create_topics(s)
    harness._CREATED.append(s)
    return s


def run_agent(base: Settings, n: int, n_endpoints: int, intents: bool,
              log_dir: Path) -> tuple[float, float]:
    """One agent over ``n`` dispatch records: (deliveries/s, CPU µs per delivery)."""
    s = fresh(base, "intents" if intents else "nointents")
    env = env_for(s, POSTBACKS_ATTEMPT_INTENTS="true" if intents else "false",
                  POSTBACKS_KAFKA_REPLICATION=s.kafka_replication)
    with Stack(env, log_dir) as stack, fast_receiver() as (url, _rx):
        seeded = seed_endpoints(s, apps=n_endpoints, endpoints_per_app=1, receiver_url=url,
                                namespace=s.topic_prefix.replace(".", ""),
                                now_ms=int(time.time() * 1000))
        produce_dispatch(s, endpoints_for(s, seeded), n // n_endpoints)
        agent = stack.start("agent", "agent")
        wait_for(lambda: http_json(f"{url}/_stats")["count"] > 0, 60, interval=0.01,
                 what="first delivery")
        t0, c0 = time.perf_counter(), cpu_s(agent.pid)
        count0 = http_json(f"{url}/_stats")["count"]
        wait_for(lambda: http_json(f"{url}/_stats")["count"] >= n, 300, interval=0.05,
                 what=f"{n} deliveries")
        elapsed, cpu = time.perf_counter() - t0, cpu_s(agent.pid) - c0
    done = n - count0
    return done / elapsed, cpu / done * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deliveries", type=int, default=10_000)
    ap.add_argument("--endpoints", type=int, default=50)
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()
    base = load_settings()
    migrate(base.database_url)
    log_dir = ROOT / ".local" / "bench-logs" / f"intents-{int(time.time())}"
    ratios: list[float] = []
    runs: dict[str, list[tuple[float, float]]] = {"with": [], "without": []}
    try:
        for i in range(args.pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            got: dict[bool, tuple[float, float]] = {}
            for intents in order:
                got[intents] = run_agent(base, args.deliveries, args.endpoints, intents,
                                         log_dir / f"{i}-{int(intents)}")
                cleanup()
            runs["with"].append(got[True])
            runs["without"].append(got[False])
            ratios.append(got[True][0] / got[False][0])
            say(f"pair {i + 1}/{args.pairs}: without {got[False][0]:.0f}/s "
                f"({got[False][1]:.0f} µs CPU each), with {got[True][0]:.0f}/s "
                f"({got[True][1]:.0f} µs CPU each): {ratios[-1]:.2f}")
    finally:
        cleanup()
    result = {
        "agent_per_s_without_intents": statistics.median(r[0] for r in runs["without"]),
        "agent_per_s_with_intents": statistics.median(r[0] for r in runs["with"]),
        "agent_cpu_us_without_intents": statistics.median(r[1] for r in runs["without"]),
        "agent_cpu_us_with_intents": statistics.median(r[1] for r in runs["with"]),
        "intents_throughput_ratio": statistics.median(ratios),
        "intents_throughput_ratio_min": min(ratios),
        "intents_throughput_ratio_max": max(ratios),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
