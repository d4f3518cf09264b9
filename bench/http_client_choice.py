"""The agent's HTTP client, h1 (own) against aiohttp and httpx, on the agent alone and on
the whole pipeline (bounded in count and time; traffic to 127.0.0.1 only).

One run, round after round; in each round, first the bare aiohttp client's POST rate
against the fast local receiver (bench/fast_receiver.py; the host's speed), then for each
client in turn (h1, aiohttp, httpx: A B C), with ``POSTBACKS_HTTP_CLIENT`` set to it:

  1. the agent alone: ``--deliveries`` dispatch records over 50 endpoints -> one agent ->
     the receiver; deliveries/s and the agent's CPU µs per delivery;
  2. the whole pipeline: ``--deliveries`` conversions -> fan-out -> gate -> agent -> sink
     -> PostgreSQL (as part ``e2e`` of bench/delivery.py); deliveries/s at the receiver and
     the CPU µs per delivery of every process, from the first delivery to the last.

Each part stops ``--max-seconds`` after its first delivery, done or not; its rate is then
that of the deliveries made by then (the table says which parts stopped so).

Prints one table: each figure's median over the rounds, as a ratio to h1 (the median of
the per-round ratios) and to the bare client's rate of the same round. The results go to
bench/results/http-client-choice.json.

Usage: make bench-http-choice  (or: python bench/http_client_choice.py --rounds 2)
Needs the services (`make services-up`) and KAFKA_BOOTSTRAP_SERVERS / POSTBACKS_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.delivery import _bare
from bench.harness import (
    ROOT,
    cleanup,
    cpu_s,
    endpoints_for,
    env_for,
    fast_receiver,
    fresh,
    own_cpu_s,
    produce_dispatch,
    say,
    service_pids,
    tree_cpu,
    tree_cpu_since,
)
from postbacks.db.migrate import migrate
from postbacks.emit import ConversionProducer, synthetic_conversions
from postbacks.settings import Settings, load_settings
from postbacks.tools.procs import Stack, http_json, wait_for
from postbacks.tools.seed import seed_endpoints
from postbacks.transport.wire import CLIENTS

ENDPOINTS = 50
RUN_SEED = int(time.time())


def bare_client(n: int) -> float:
    with fast_receiver() as (url, _rx):
        own0 = own_cpu_s()
        rate = uvloop.run(_bare(f"{url}/hooks/bare", n))
        say(f"bare aiohttp client: {rate:.0f} POSTs/s, "
            f"{(own_cpu_s() - own0) / n * 1e6:.0f} µs CPU each")
        return rate


def _count(url: str) -> int:
    return int(http_json(f"{url}/_stats")["count"])


def _until(url: str, n: int, max_s: float) -> int:
    """Wait until the receiver has ``n`` deliveries or ``max_s`` passed; the count then."""
    deadline = time.monotonic() + max_s
    while (got := _count(url)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def agent_alone(base: Settings, client: str, n: int, max_s: float,
                log_dir: Path) -> dict[str, float]:
    s = fresh(base, f"agent{client}")
    with Stack(env_for(s, POSTBACKS_HTTP_CLIENT=client), log_dir) as stack, \
            fast_receiver() as (url, _rx):
        seeded = seed_endpoints(s, apps=ENDPOINTS, endpoints_per_app=1, receiver_url=url,
                                namespace=s.instance_id.replace("-", ""),
                                now_ms=int(time.time() * 1000))
        produce_dispatch(s, endpoints_for(s, seeded), n // ENDPOINTS)
        n = n // ENDPOINTS * ENDPOINTS
        agent = stack.start("agent", "agent")
        wait_for(lambda: http_json(f"{url}/_stats")["count"] > 0, 60, interval=0.01,
                 what="first delivery")
        t0, c0 = time.perf_counter(), cpu_s(agent.pid)
        count0 = _count(url)
        got = _until(url, n, max_s)
        elapsed, cpu = time.perf_counter() - t0, cpu_s(agent.pid) - c0
        done = max(1, got - count0)
        capped = f" (stopped at {max_s:.0f} s with {got:,} of {n:,})" if got < n else ""
        say(f"agent alone ({client}): {done / elapsed:.0f} deliveries/s, "
            f"{cpu / done * 1e6:.0f} µs CPU each{capped}")
        return {"agent_per_s": done / elapsed, "agent_cpu_us": cpu / done * 1e6,
                "agent_capped": float(got < n)}


def pipeline(base: Settings, client: str, n: int, seed: int, max_s: float,
             log_dir: Path) -> dict[str, float]:
    """Part ``e2e`` of bench/delivery.py with ``POSTBACKS_HTTP_CLIENT=client``, stopped after
    ``max_s`` from the first delivery (the rate is then of those delivered by then)."""
    s = fresh(base, f"e2e{client}")
    with fast_receiver() as (url, rx):
        ns = s.instance_id.replace("-", "")
        seed_endpoints(s, apps=ENDPOINTS, endpoints_per_app=1, receiver_url=url, namespace=ns,
                       now_ms=int(time.time() * 1000))
        with Stack(env_for(s, POSTBACKS_HTTP_CLIENT=client), log_dir) as stack:
            for stage in ("sink", "agent", "gate", "fanout"):
                stack.start(stage, stage)
            pids = {name: p.pid for name, p in stack.procs.items()} | {"receiver": rx.pid}
            pids |= service_pids()
            producer = ConversionProducer(s)
            for ev in synthetic_conversions(n, apps=ENDPOINTS, seed=seed, namespace=ns,
                                            now_ms=int(time.time() * 1000)):
                producer.send(ev)
            producer.flush()
            wait_for(lambda: _count(url) > 0, 60, interval=0.01, what="first delivery")
            t0, c0 = time.perf_counter(), _count(url)
            cpu1 = {name: tree_cpu(pid) for name, pid in pids.items()}
            got = _until(url, n, max_s)
            elapsed = time.perf_counter() - t0
            done = max(1, got - c0)
            share = {name: tree_cpu_since(pid, cpu1[name]) / done * 1e6
                     for name, pid in pids.items()}
    capped = f" (stopped at {max_s:.0f} s with {got:,} of {n:,})" if got < n else ""
    cpu = ", ".join(f"{k} {v:.0f}" for k, v in sorted(share.items(), key=lambda x: -x[1]))
    say(f"whole pipeline ({client}): {done / elapsed:.0f} deliveries/s{capped}; CPU µs per "
        f"delivery by process: {cpu}; total {sum(share.values()):.0f}")
    return {"pipeline_per_s": done / elapsed, "pipeline_cpu_us": sum(share.values()),
            "pipeline_agent_cpu_us": share["agent"], "pipeline_capped": float(got < n)}


def _table(rounds: list[dict[str, dict[str, float]]]) -> str:
    def med(client: str, key: str) -> float:
        return statistics.median(r[client][key] for r in rounds)

    def rel(client: str, key: str, to: str) -> float:
        return statistics.median(r[client][key] / r[to][key] for r in rounds)

    def span(client: str, key: str) -> str:
        values = [r[client][key] for r in rounds]
        return f"{min(values):,.0f}-{max(values):,.0f}"

    def capped(client: str) -> str:
        n = sum(int(r[client][k]) for r in rounds for k in ("agent_capped", "pipeline_capped"))
        return f" (stopped at the time cap in {n} parts)" if n else ""

    lines = [
        "| client | agent alone /s | agent CPU µs/delivery | agent vs h1 | agent / bare "
        "| pipeline /s (range) | pipeline CPU µs/delivery (agent) | **pipeline vs h1** "
        "| pipeline / bare |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in CLIENTS:
        lines.append(
            f"| {c}{capped(c)} | {med(c, 'agent_per_s'):,.0f} | {med(c, 'agent_cpu_us'):.0f} "
            f"| {rel(c, 'agent_per_s', 'h1'):.2f} | {rel(c, 'agent_per_s', 'bare'):.2f} "
            f"| {med(c, 'pipeline_per_s'):,.0f} ({span(c, 'pipeline_per_s')}) "
            f"| {med(c, 'pipeline_cpu_us'):.0f} ({med(c, 'pipeline_agent_cpu_us'):.0f}) "
            f"| **{rel(c, 'pipeline_per_s', 'h1'):.2f}** "
            f"| {rel(c, 'pipeline_per_s', 'bare'):.2f} |")
    bare = [r["bare"]["agent_per_s"] for r in rounds]
    lines.append(f"\nbare aiohttp client: {', '.join(f'{b:,.0f}' for b in bare)} POSTs/s "
                 f"(one per round); {len(rounds)} rounds")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--deliveries", type=int, default=8000,
                    help="per client and part in each round (default 8000)")
    ap.add_argument("--bare-requests", type=int, default=10_000)
    ap.add_argument("--max-seconds", type=float, default=45.0,
                    help="each part stops this long after its first delivery, done or not "
                         "(default 45)")
    args = ap.parse_args()
    if args.rounds < 2:
        ap.error("--rounds must be at least 2 (a figure is a median over rounds)")
    if not 1000 <= args.deliveries <= 50_000:
        ap.error("--deliveries must be between 1000 and 50000")
    base = load_settings()
    migrate(base.database_url)
    log_dir = ROOT / ".local" / "bench-logs" / f"http-choice-{int(time.time())}"
    rounds: list[dict[str, dict[str, float]]] = []
    try:
        for r in range(args.rounds):
            say(f"round {r + 1}/{args.rounds}")
            got: dict[str, dict[str, float]] = {}
            bare = bare_client(args.bare_requests)
            got["bare"] = {"agent_per_s": bare, "pipeline_per_s": bare}
            for i, client in enumerate(CLIENTS):
                got[client] = agent_alone(base, client, args.deliveries, args.max_seconds,
                                          log_dir / f"agent-{client}-{r}")
                got[client] |= pipeline(base, client, args.deliveries,
                                        RUN_SEED + 7919 * r + 101 * i, args.max_seconds,
                                        log_dir / f"e2e-{client}-{r}")
                cleanup()  # this run's topics: a broker keeping them spends CPU on them
            rounds.append(got)
    finally:
        cleanup()
    out = ROOT / "bench" / "results" / "http-client-choice.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(rounds, indent=2))
    print(f"\n=== HTTP client choice ({args.deliveries:,} deliveries per client and part "
          f"each round) ===\n")
    print(_table(rounds))
    print(f"(rounds written to {out})")


if __name__ == "__main__":
    main()
