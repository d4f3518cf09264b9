"""settle_gc: start-up objects frozen, the young generation's threshold raised, and cyclic
garbage made afterwards still collected. In a child interpreter: the collector's state is
process-wide."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import gc, json
from postbacks.runtime import settle_gc
from postbacks.metrics import GC_FROZEN, GC_GEN0_THRESHOLD
before = gc.get_freeze_count()
settle_gc(5000)
frozen = gc.get_freeze_count()

class Node:
    pass

def cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a

for _ in range(100):
    cycle()
collected = gc.collect()
print(json.dumps({"before": before, "frozen": frozen, "threshold": gc.get_threshold(),
                  "collected": collected, "gauge_frozen": GC_FROZEN._value.get(),
                  "gauge_threshold": GC_GEN0_THRESHOLD._value.get()}))
"""


def test_settle_gc_freezes_start_up_objects_and_raises_the_young_threshold() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    got = json.loads(out)
    assert got["before"] == 0
    assert got["frozen"] > 10_000  # the package's and the libraries' start-up objects
    assert got["threshold"][0] == 5000 and got["threshold"][1:] == [10, 10]
    assert got["collected"] >= 200  # 100 two-object cycles made after the freeze
    assert got["gauge_frozen"] == got["frozen"] and got["gauge_threshold"] == 5000
