"""The Avro codec alone: µs per record to decode and to encode a Delivery, an Attempt and an
Outcome as the stages see them, through :class:`postbacks.codec.Codec` (the C codec,
``postbacks/avro_c.pyx``, with the single-object framing) against fastavro's schemaless
reader and writer on the same bodies, in alternating rounds. No services needed.

The records are realistic: deliveries planned by fan-out's own code from synthetic
conversions, each one's signed request (~600-byte body) in its Attempt.

Usage: python bench/avro_codec.py [--records 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import delivered_records, say
from postbacks.codec import codec_for


def build(n: int) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {"Delivery": [], "Attempt": [], "Outcome": []}
    for d, a, o in delivered_records(n, seed=1, namespace="ab"):
        out["Delivery"].append(dict(d))
        out["Attempt"].append(dict(a))
        out["Outcome"].append(dict(o))
    return out


def per_record_us(fn: Callable[[Any], object], items: list[Any]) -> float:
    t0 = time.perf_counter()
    for x in items:
        fn(x)
    return (time.perf_counter() - t0) / len(items) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=2000, help="records of each type")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    args = ap.parse_args()
    say(f"building {args.records} deliveries, attempts and outcomes ...")
    records = build(args.records)
    results: dict[str, list[float]] = {}
    for rnd in range(args.rounds):
        for name, items in records.items():
            codec = codec_for(name)
            schema = codec.writer.parsed
            framed = [codec.encode(x) for x in items]
            bodies = [f[10:] for f in framed]

            def fa_encode(x: Any, schema: Any = schema) -> bytes:
                buf = io.BytesIO()
                fastavro.schemaless_writer(buf, schema, x)
                return buf.getvalue()

            def fa_decode(b: bytes, schema: Any = schema) -> Any:
                return fastavro.schemaless_reader(io.BytesIO(b), schema, None)

            assert [fa_encode(x) for x in items[:50]] == bodies[:50]
            cases = {"decode_c": (codec.decode, framed), "decode_fastavro": (fa_decode, bodies),
                     "encode_c": (codec.encode, items), "encode_fastavro": (fa_encode, items)}
            order = list(cases) if rnd % 2 == 0 else list(reversed(cases))
            for case in order:
                fn, data = cases[case]
                results.setdefault(f"{name}_{case}", []).append(per_record_us(fn, data))
        say(f"round {rnd + 1}/{args.rounds} done")
    print("\n=== Avro codec, µs per record (median, lowest-highest of the rounds) ===")
    for name in records:
        for op in ("decode", "encode"):
            c, fa = results[f"{name}_{op}_c"], results[f"{name}_{op}_fastavro"]
            ratio = statistics.median(f / m for f, m in zip(fa, c, strict=True))
            print(f"{name:9s} {op}: C {statistics.median(c):5.1f} ({min(c):.1f}-{max(c):.1f})"
                  f"  fastavro {statistics.median(fa):5.1f} ({min(fa):.1f}-{max(fa):.1f})"
                  f"  fastavro/C {ratio:.1f}x")


if __name__ == "__main__":
    main()
