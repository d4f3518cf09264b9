"""Two agent processes against one on the same dispatch partitions (part ``agents`` of
bench/delivery.py): the same backlog, the same fast receiver, one consumer group of one
and then of two members. Bounded in count and time; traffic to 127.0.0.1 only."""

from __future__ import annotations

import time
from pathlib import Path

from bench.harness import (
    DispatchWriter,
    broker_partitions,
    endpoints_for,
    env_for,
    fast_receiver,
    fresh,
    say,
    tree_cpu,
    tree_cpu_since,
)
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, http_json, wait_for
from postbacks.tools.seed import seed_endpoints

__all__ = ["run_agents"]


def _members_assigned(s: Settings, group: str, members: int) -> bool:
    """Whether ``group`` is stable with ``members`` members, each holding partitions."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": s.kafka_bootstrap_servers})
    try:
        desc = admin.describe_consumer_groups([group], request_timeout=5)[group].result()
    except Exception:  # not there yet
        return False
    return bool(desc.state == ConsumerGroupState.STABLE and len(desc.members) == members
                and all(m.assignment.topic_partitions for m in desc.members))


def _one_run(base: Settings, agents: int, n: int, n_endpoints: int, seed: int,
             log_dir: Path) -> tuple[float, float]:
    """Deliveries/s from the first postback to the ``n``-th, and the agents' CPU µs per
    delivery, with ``agents`` agent processes in one group."""
    s = fresh(base, f"agents{agents}")
    with fast_receiver() as (url, _rx), Stack(env_for(s), log_dir) as stack:
        seeded = seed_endpoints(s, apps=n_endpoints, endpoints_per_app=1, receiver_url=url,
                                namespace=s.instance_id.replace("-", ""),
                                now_ms=int(time.time() * 1000))
        eps = endpoints_for(s, seeded)
        writer = DispatchWriter(s)
        backlog = list(writer.records(eps, n // n_endpoints, seed=seed))
        n = len(backlog)
        for i in range(agents):  # each its own instance id: its own transactional id
            stack.start(f"agent{i}", "agent",
                        extra_env={"POSTBACKS_INSTANCE_ID": f"bench-agents-{i}"})
        group = s.topic("postbacks-agent")
        wait_for(lambda: _members_assigned(s, group, agents), 90, interval=0.2,
                 what=f"{agents} agent(s) holding partitions")
        pids = {name: p.pid for name, p in stack.procs.items()}
        cpu0 = {name: tree_cpu(pid) for name, pid in pids.items()}
        writer.produce(backlog)  # prepared before: the window holds only the producing
        writer.close()
        wait_for(lambda: http_json(f"{url}/_stats")["count"] > 0, 60, interval=0.01,
                 what="first delivery")
        t0 = time.perf_counter()
        c0 = http_json(f"{url}/_stats")["count"]
        wait_for(lambda: http_json(f"{url}/_stats")["count"] >= n, 300, interval=0.05,
                 what=f"{n} deliveries")
        rate = (n - c0) / (time.perf_counter() - t0)
        cpu = sum(tree_cpu_since(pid, cpu0[name]) for name, pid in pids.items()) / n * 1e6
    return rate, cpu


def run_agents(base: Settings, n: int, n_endpoints: int, seed: int,
               log_dir: Path) -> dict[str, float]:
    """One agent, then two, each on a backlog of ``n`` deliveries over the same
    partitions of dispatch.v1."""
    say(f"agents: one agent, then two in one group, {n} deliveries each "
        f"(the broker holds {broker_partitions(base):,} partitions) ...")
    one, one_cpu = _one_run(base, 1, n, n_endpoints, seed, log_dir / "one")
    two, two_cpu = _one_run(base, 2, n, n_endpoints, seed + 1, log_dir / "two")
    say(f"agents: one {one:.0f}/s ({one_cpu:.0f} µs CPU each), two {two:.0f}/s "
        f"({two_cpu:.0f} µs CPU each in both): two / one {two / one:.2f}")
    return {"agents_one_per_s": one, "agents_two_per_s": two, "two_agents_over_one": two / one,
            "agents_one_cpu_us_per_delivery": one_cpu,
            "agents_two_cpu_us_per_delivery": two_cpu}
