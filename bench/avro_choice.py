"""The Avro codec's share of the whole pipeline: the same runs with the C codec
(``POSTBACKS_AVRO_CODEC=c``, ``postbacks/avro_c.pyx``) and with plain fastavro
(``POSTBACKS_AVRO_CODEC=fastavro``), alternating A B A B in one run.

Each round runs, with each codec in turn, part ``e2e`` of ``bench/delivery.py``
(conversions -> fan-out -> gate -> agent -> sink) and part ``engine`` (a backlog of
deliveries -> agent -> sink -> PostgreSQL); every stage process reads the codec from its
environment. Reported: deliveries/s and CPU µs per delivery by process, the median of the
rounds with each codec, and fastavro / C as the median of the rounds' ratios. The bench's
own encoding (the backlog, the conversions) happens before the timed window with the
codec its process started with and is not counted.

Usage: python bench/avro_choice.py [--deliveries 20000] [--rounds 2] [--parts e2e,engine]
Needs the services and KAFKA_BOOTSTRAP_SERVERS / POSTBACKS_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import TextIO

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.delivery import RUN_SEED, run_end_to_end
from bench.engine import run_engine
from bench.harness import ROOT, cleanup, say, scratch_database
from postbacks.settings import Settings, load_settings

CODECS = ("c", "fastavro")
_BY_PROCESS = re.compile(r"by process(?:, from the first to the last delivery)?: ([^;]+); total")
_RATE = {"e2e": "end_to_end_per_s", "engine": "engine_end_to_end_per_s"}


class _Tee(io.StringIO):
    def __init__(self, out: TextIO) -> None:
        super().__init__()
        self._out = out

    def write(self, s: str) -> int:
        self._out.write(s)
        return super().write(s)


def _by_process(text: str) -> dict[str, float]:
    """The CPU µs per delivery by process that the part printed."""
    m = _BY_PROCESS.search(text)
    if m is None:
        raise RuntimeError("the part printed no CPU by process")
    out: dict[str, float] = {}
    for item in m.group(1).split(", "):
        name, value = item.rsplit(" ", 1)
        out[name] = float(value)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deliveries", type=int, default=20_000)
    ap.add_argument("--endpoints", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of A B (default 2)")
    ap.add_argument("--parts", default="e2e,engine", help="comma-separated: e2e, engine")
    ap.add_argument("--fresh-db", action="store_true",
                    help="run against a new database beside POSTBACKS_DATABASE_URL's, "
                         "migrated, dropped afterwards")
    args = ap.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    if not parts or set(parts) - set(_RATE) or args.rounds < 1:
        ap.error("--parts is a subset of e2e,engine and --rounds at least 1")
    base = load_settings()
    log_dir = ROOT / ".local" / "bench-logs" / f"avro-choice-{int(time.time())}"
    # runs[part][codec] = one dict per round: rate and CPU by process
    runs: dict[str, dict[str, list[dict[str, float]]]] = {p: {c: [] for c in CODECS}
                                                          for p in parts}
    saved = os.environ.get("POSTBACKS_AVRO_CODEC")
    try:
        with contextlib.ExitStack() as db:
            if args.fresh_db:
                url = db.enter_context(scratch_database(base.database_url,
                                                        f"avro{int(time.time())}"))
                base = dataclasses.replace(base, database_url=url)
            for rnd in range(args.rounds):
                for codec in CODECS:
                    os.environ["POSTBACKS_AVRO_CODEC"] = codec  # the stages inherit it
                    for part in parts:
                        run_one(base, args, part, codec, rnd, log_dir, runs)
    finally:
        cleanup()
        if saved is None:
            os.environ.pop("POSTBACKS_AVRO_CODEC", None)
        else:
            os.environ["POSTBACKS_AVRO_CODEC"] = saved
    report(runs)


def run_one(base: Settings, args: argparse.Namespace, part: str, codec: str, rnd: int,
            log_dir: Path, runs: dict[str, dict[str, list[dict[str, float]]]]) -> None:
    say(f"round {rnd + 1}/{args.rounds}: {part} with codec {codec}")
    seed = RUN_SEED + 7919 * (2 * rnd + CODECS.index(codec))
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        if part == "e2e":
            got = run_end_to_end(base, args.deliveries, log_dir / f"e2e-{codec}-{rnd}",
                                 seed=seed)
        else:
            got = run_engine(base, args.deliveries, args.endpoints, seed,
                             log_dir / f"engine-{codec}-{rnd}")
    cpu = _by_process(tee.getvalue())
    runs[part][codec].append({"per_s": got[_RATE[part]], "total": sum(cpu.values())} | cpu)
    cleanup()


def report(runs: dict[str, dict[str, list[dict[str, float]]]]) -> None:
    results: dict[str, float] = {}
    for part, by_codec in runs.items():
        c_runs, fa_runs = by_codec["c"], by_codec["fastavro"]
        stages = sorted({k for r in c_runs + fa_runs for k in r} - {"per_s", "total"},
                        key=lambda k: -statistics.median(r.get(k, 0.0) for r in c_runs))
        keys = ["per_s", "total", *stages]
        print(f"\n=== {part}: C codec against fastavro, {len(c_runs)} rounds each "
              f"(median; lowest-highest) ===")
        print(f"{'figure':22s} {'C':>22s} {'fastavro':>22s} {'fastavro/C':>11s}")
        for key in keys:
            c = [r.get(key, 0.0) for r in c_runs]
            fa = [r.get(key, 0.0) for r in fa_runs]
            ratios = [f / m for f, m in zip(fa, c, strict=True) if m]
            ratio = statistics.median(ratios) if ratios else float("nan")
            label = "deliveries/s" if key == "per_s" else f"CPU µs/dlv {key}"

            def fmt(v: list[float]) -> str:
                return f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})"

            print(f"{label:22s} {fmt(c):>22s} {fmt(fa):>22s} {ratio:>10.3f}x")
            results[f"{part}_{key}_c"] = statistics.median(c)
            results[f"{part}_{key}_fastavro"] = statistics.median(fa)
            results[f"{part}_{key}_fastavro_over_c"] = ratio
    out = ROOT / "bench" / "results" / "avro-choice-latest.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"runs": runs, "summary": results}, indent=2))
    print(f"(written to {out})")


if __name__ == "__main__":
    main()
