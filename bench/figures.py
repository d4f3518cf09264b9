"""The benchmark's figures across runs: several rounds summarised, and a run's figures
merged into the results file (``bench/results/latest.json``)."""

from __future__ import annotations

import statistics

from bench.harness import say

__all__ = ["host_relative", "merge_results", "summarize_rounds"]

# What the host's speed is read from: the bare aiohttp client's rate against the fast
# receiver, measured in the same round as the engine (part ``agent``).
_BARE = "bare_client_per_s"
_RELATIVE = {"engine_end_to_end_per_s": "engine_over_bare",
             "engine_offered_per_s": "engine_offered_over_bare",
             "end_to_end_per_s": "pipeline_over_bare"}


def host_relative(got: dict[str, float]) -> dict[str, float]:
    """One round's throughput figures as fractions of the bare client's rate in the same
    round, so that what moves with the host's speed cancels out (docs/performance.md).
    Empty without the bare client's rate."""
    bare = got.get(_BARE)
    if not bare:
        return {}
    return {name: got[key] / bare for key, name in _RELATIVE.items() if key in got}


def summarize_rounds(rounds: list[dict[str, float]]) -> dict[str, float]:
    """One round's figures as they are; several rounds' as the median of each figure, with
    its lowest and highest (``_min``, ``_max``) and the number of rounds that measured it
    (``_rounds``); a verdict (``..._kept_up``, ``..._fell_behind``: 1 or 0 a round) as the
    number of rounds that said it."""
    if len(rounds) == 1:
        return rounds[0]
    out: dict[str, float] = {}
    keys = list(dict.fromkeys(k for r in rounds for k in r))  # every round's, in order
    for key in keys:
        values = [r[key] for r in rounds if key in r]
        if key.endswith(("_kept_up", "_fell_behind")):
            out |= {key: float(sum(values)), f"{key}_rounds": float(len(values))}
            continue
        out |= {key: statistics.median(values), f"{key}_min": min(values),
                f"{key}_max": max(values), f"{key}_rounds": float(len(values))}
    say("rounds: " + "; ".join(f"{key} " + ", ".join(f"{r[key]:.0f}" for r in rounds if key in r)
                               for key in keys if key.endswith("_per_s")))
    return out


def merge_results(earlier: dict[str, float], results: dict[str, float]) -> dict[str, float]:
    """``results`` over the figures of earlier runs of other parts: a figure measured now
    replaces its earlier value and its earlier rounds' range (``_min``, ``_max``,
    ``_rounds``), which would otherwise stand beside it from another run."""
    stale = {f"{k}{suffix}" for k in results for suffix in ("", "_min", "_max", "_rounds")}
    return {k: v for k, v in earlier.items() if k not in stale} | results
