"""The delivery engine end to end: a backlog of deliveries -> agent -> signed POST ->
attempt + outcome records -> sink -> PostgreSQL, until every delivery is on record there as
``delivered`` with its attempt counted (part ``engine`` of ``bench/delivery.py``).

The backlog is what fan-out and the gate hand the engine: each delivery on deliveries.v1
(the sink records the delivery row from it) and on dispatch.v1 (the agent sends it). The
stages upstream of the engine (fan-out, the anomaly gate) are not running here; the whole
pipeline is part ``e2e``.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.harness import (
    DispatchWriter,
    endpoints_for,
    env_for,
    fast_receiver,
    fresh,
    say,
    service_pids,
    tree_cpu,
    tree_cpu_since,
)
from postbacks.db.connect import connect
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, http_json, wait_for
from postbacks.tools.seed import seed_endpoints

__all__ = ["run_engine"]

_ON_RECORD = ("SELECT count(*) FROM deliveries WHERE endpoint_id = ANY(%s) "
              "AND status = 'delivered' AND attempt_count >= 1")


def run_engine(base: Settings, n: int, n_endpoints: int, seed: int,
               log_dir: Path) -> dict[str, float]:
    s = fresh(base, "engine")
    with fast_receiver() as (url, rx):
        ns = s.instance_id.replace("-", "")
        seeded = seed_endpoints(s, apps=n_endpoints, endpoints_per_app=1, receiver_url=url,
                                namespace=ns, now_ms=int(time.time() * 1000))
        eps = endpoints_for(s, seeded)
        ep_ids = [e.endpoint_id for e in eps]
        say(f"engine: producing {n} deliveries over {n_endpoints} endpoints to deliveries.v1 "
            f"and dispatch.v1 ...")
        writer = DispatchWriter(s)
        writer.send(eps, n // n_endpoints, seed=seed, also_deliveries=True)
        writer.close()
        n = (n // n_endpoints) * n_endpoints
        with Stack(env_for(s), log_dir) as stack, connect(s.database_url,
                                                          autocommit=True) as db:
            for stage in ("sink", "agent"):
                stack.start(stage, stage)
            pids = {name: p.pid for name, p in stack.procs.items()} | {"receiver": rx.pid}
            pids |= service_pids()
            wait_for(lambda: http_json(f"{url}/_stats")["count"] > 0, 60, interval=0.01,
                     what="first delivery")
            t0 = time.perf_counter()
            c0 = http_json(f"{url}/_stats")["count"]
            cpu1 = {name: tree_cpu(pid) for name, pid in pids.items()}
            wait_for(lambda: http_json(f"{url}/_stats")["count"] >= n, 300, interval=0.05,
                     what=f"{n} deliveries sent")
            sent_s = time.perf_counter() - t0

            def on_record() -> bool:
                row = db.execute(_ON_RECORD, (ep_ids,)).fetchone()
                return row is not None and row[0] >= n

            wait_for(on_record, 300, interval=0.1, what=f"{n} deliveries on record")
            elapsed = time.perf_counter() - t0
            share = {name: tree_cpu_since(pid, cpu1[name]) / (n - c0) * 1e6
                     for name, pid in pids.items()}
        rate = (n - c0) / elapsed
        cpu = ", ".join(f"{k} {v:.0f}" for k, v in sorted(share.items(), key=lambda x: -x[1]))
        say(f"engine end to end: {rate:.0f} deliveries/s on record in PostgreSQL "
            f"({(n - c0) / sent_s:.0f}/s sent); CPU µs per delivery by process: {cpu}; "
            f"total {sum(share.values()):.0f}")
        return {"engine_end_to_end_per_s": rate,
                "engine_end_to_end_cpu_us_per_delivery": sum(share.values())}
