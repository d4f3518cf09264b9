"""Wire framing of an Avro record on a topic: bytes per record and µs per record of the
framing step alone, for three framings of the same Avro body. No services needed.

- ``single-object``: Avro single-object encoding, what :mod:`postbacks.codec` writes:
  ``C3 01`` + the 8-byte little-endian CRC-64-AVRO fingerprint of the writer schema.
- ``confluent``: the Confluent wire format: ``00`` + a 4-byte big-endian schema-registry id
  (the id -> schema lookup is a dict here, as a client's cache holds it once fetched).
- ``raw``: the body alone; the reader must know the writer schema out of band.

Encode is header + body; decode is reading the header, finding the writer schema by it
and handing back the body's offset. The bodies are the C codec's encoding of realistic
deliveries, attempts and outcomes (bench/harness.py), the same for every framing.

Usage: python bench/framing.py [--records 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import delivered_records, say
from postbacks.codec import MAGIC, codec_for

_SOE = struct.Struct("<2sQ")
_CONFLUENT = struct.Struct(">bI")


def framings(fp: int, registry_id: int, schema: Any) -> dict[str, tuple[Callable[[bytes], bytes],
                                                                          Callable[[bytes], Any]]]:
    soe_prefix = _SOE.pack(MAGIC, fp)
    cf_prefix = _CONFLUENT.pack(0, registry_id)
    by_fp = {fp: schema}
    by_id = {registry_id: schema}

    def soe_decode(data: bytes) -> tuple[Any, int]:
        magic, f = _SOE.unpack_from(data)
        if magic != MAGIC:
            raise ValueError("magic")
        return by_fp[f], _SOE.size

    def cf_decode(data: bytes) -> tuple[Any, int]:
        magic, i = _CONFLUENT.unpack_from(data)
        if magic != 0:
            raise ValueError("magic")
        return by_id[i], _CONFLUENT.size

    def raw_decode(data: bytes) -> tuple[Any, int]:
        return schema, 0

    return {"single-object": (lambda b: soe_prefix + b, soe_decode),
            "confluent": (lambda b: cf_prefix + b, cf_decode),
            "raw": (lambda b: b, raw_decode)}


def per_record_us(fn: Callable[[Any], object], items: list[Any]) -> float:
    t0 = time.perf_counter()
    for x in items:
        fn(x)
    return (time.perf_counter() - t0) / len(items) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=2000, help="records of each type")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    say(f"building {args.records} deliveries, attempts and outcomes ...")
    bodies: dict[str, list[bytes]] = {"Delivery": [], "Attempt": [], "Outcome": []}
    for d, a, o in delivered_records(args.records, seed=1, namespace="fr"):
        for name, rec in (("Delivery", d), ("Attempt", a), ("Outcome", o)):
            bodies[name].append(codec_for(name).encode(dict(rec))[_SOE.size:])
    results: dict[str, list[float]] = {}
    sizes: dict[str, float] = {}
    for name, items in bodies.items():
        codec = codec_for(name)
        cases = framings(codec.writer.fingerprint, 7, codec.writer.parsed)
        body_len = statistics.mean(len(b) for b in items)
        for frame, (enc, _dec) in cases.items():
            sizes[f"{name}_{frame}"] = statistics.mean(len(enc(b)) for b in items)
        sizes[f"{name}_body"] = body_len
        for rnd in range(args.rounds):
            order = list(cases) if rnd % 2 == 0 else list(reversed(cases))
            for frame in order:
                enc, dec = cases[frame]
                framed = [enc(b) for b in items]
                results.setdefault(f"{name}_{frame}_encode", []).append(
                    per_record_us(enc, items))
                results.setdefault(f"{name}_{frame}_decode", []).append(
                    per_record_us(dec, framed))
    # the whole codec, for scale: the single-object framing is part of these figures
    whole: dict[str, float] = {}
    for name, items in bodies.items():
        codec = codec_for(name)
        framed = [_SOE.pack(MAGIC, codec.writer.fingerprint) + b for b in items]
        records = [codec.decode(f) for f in framed]
        whole[f"{name}_decode"] = statistics.median(
            per_record_us(codec.decode, framed) for _ in range(args.rounds))
        whole[f"{name}_encode"] = statistics.median(
            per_record_us(codec.encode, records) for _ in range(args.rounds))
    print(f"\n=== framing: bytes per record and µs per record of the framing step "
          f"(median of {args.rounds} rounds), codec {codec_for('Delivery').impl} ===")
    print(f"{'record':9s} {'framing':14s} {'bytes':>7s} {'header':>7s} "
          f"{'encode µs':>10s} {'decode µs':>10s}")
    for name in bodies:
        for frame in ("single-object", "confluent", "raw"):
            total = sizes[f"{name}_{frame}"]
            enc_us = statistics.median(results[f"{name}_{frame}_encode"])
            dec_us = statistics.median(results[f"{name}_{frame}_decode"])
            print(f"{name:9s} {frame:14s} {total:7.0f} {total - sizes[f'{name}_body']:7.0f} "
                  f"{enc_us:10.3f} {dec_us:10.3f}")
        print(f"{name:9s} {'(whole codec)':14s} {'':7s} {'':7s} "
              f"{whole[f'{name}_encode']:10.3f} {whole[f'{name}_decode']:10.3f}")


if __name__ == "__main__":
    main()
