"""The demo's groups, their counts read back from PostgreSQL and the receiver, the checks
each group must pass, and the final table (see :mod:`postbacks.tools.demo`).

Every count comes from the attempt log and the outcomes the sink wrote
(``deliveries``, ``delivery_attempts``, ``delivery_outcomes``, ``dead_letters``), and is
cross-checked against what the receiver saw (``/_control/received``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from postbacks.db.connect import connect

__all__ = ["GROUPS", "Counts", "Group", "Row", "Seen", "check", "count_group", "progress_counts",
           "progress_line", "receiver_view", "render_table", "sample_ids", "where_to_see"]

GROUPS = ("healthy", "flaky", "dead", "cohort", "replay")


@dataclass
class Group:
    """One group of the demo: its endpoints (the replay group: the deliveries it replays)
    and what it must show."""

    name: str
    endpoint_ids: list[str]
    expected: int  # deliveries
    apps: list[str] = field(default_factory=list)
    delivery_ids: list[str] = field(default_factory=list)  # replay: the replayed ones
    attempts_each: int = 1  # dead: its endpoint's max_attempts; flaky: failures + 1
    since: float = 0.0  # cohort: when it was released; replay: when it was replayed


@dataclass
class Counts:
    deliveries: int = 0
    attempts: int = 0  # every attempt but replays (trigger manual); replay group: replays
    delivered: int = 0
    retried: int = 0  # deliveries with more than one attempt
    quarantined: int = 0
    dead_lettered: int = 0  # rows in dead_letters
    exhausted: int = 0  # status exhausted or dead_lettered
    held: int = 0
    held_retrodated: int = 0
    released: int = 0
    release_attempts: int = 0
    replayed: int = 0


@dataclass
class Seen:
    """What the receiver saw of a group."""

    requests: int = 0
    unique: int = 0  # webhook-ids; replay: deliveries received again
    early: int = 0  # cohort: requests before the release; replay: not received again
    bad_signatures: int = 0


@dataclass
class Row:
    group: str
    counts: Counts  # from PostgreSQL
    receiver: Seen
    problems: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, **asdict(self.counts),
                **{f"receiver_{k}": v for k, v in asdict(self.receiver).items()},
                "problems": self.problems, "ok": not self.problems}


_COUNT_SQL = """
WITH d AS (
  SELECT delivery_id, status, hold_reason FROM deliveries
   WHERE endpoint_id = ANY(%(eps)s) OR delivery_id = ANY(%(ids)s)
), a AS (
  SELECT d.delivery_id,
         count(x.attempt_id) FILTER (WHERE x.trigger <> 'manual') AS n,
         count(x.attempt_id) FILTER (WHERE x.trigger = 'manual') AS m,
         count(x.attempt_id) FILTER (WHERE x.trigger = 'release') AS r
    FROM d LEFT JOIN delivery_attempts x ON x.delivery_id = d.delivery_id
   GROUP BY d.delivery_id
), o AS (
  SELECT d.delivery_id, array_agg(DISTINCT y.kind) AS kinds
    FROM d JOIN delivery_outcomes y ON y.delivery_id = d.delivery_id
   GROUP BY d.delivery_id
)
SELECT count(*),
       coalesce(sum(CASE WHEN %(replay)s THEN a.m ELSE a.n END), 0),
       count(*) FILTER (WHERE d.status = 'delivered'),
       count(*) FILTER (WHERE a.n > 1),
       count(*) FILTER (WHERE 'quarantined' = ANY(o.kinds)),
       (SELECT count(*) FROM dead_letters z WHERE z.delivery_id IN (SELECT delivery_id FROM d)),
       count(*) FILTER (WHERE d.status IN ('exhausted', 'dead_lettered')),
       count(*) FILTER (WHERE 'held' = ANY(o.kinds)),
       count(*) FILTER (WHERE d.hold_reason = 'retrodated'),
       count(*) FILTER (WHERE 'released' = ANY(o.kinds)),
       coalesce(sum(a.r), 0),
       count(*) FILTER (WHERE 'replayed' = ANY(o.kinds))
  FROM d JOIN a USING (delivery_id) LEFT JOIN o USING (delivery_id)
"""


def count_group(database_url: str, g: Group) -> Counts:
    """The group's counts from PostgreSQL."""
    replay = g.name == "replay"
    with connect(database_url) as conn:
        row = conn.execute(_COUNT_SQL, {
            "eps": [] if replay else g.endpoint_ids, "ids": g.delivery_ids if replay else [],
            "replay": replay}).fetchone()
    assert row is not None
    return Counts(*(int(x) for x in row))


def progress_counts(database_url: str, groups: Sequence[Group]) -> dict[str, Counter[str]]:
    """Status counts per group (cheap: the endpoint index), for the progress line."""
    by_ep = {ep: g.name for g in groups if g.name != "replay" for ep in g.endpoint_ids}
    out: dict[str, Counter[str]] = {g.name: Counter() for g in groups}
    with connect(database_url) as conn:
        for ep, status, n in conn.execute(
            "SELECT endpoint_id, status, count(*) FROM deliveries"
            " WHERE endpoint_id = ANY(%s) GROUP BY 1, 2", (list(by_ep),)).fetchall():
            out[by_ep[ep]][status] += int(n)
    return out


def progress_line(el: float, st: dict[str, Counter[str]], g: dict[str, Group],
              stats: dict[str, Any], phase: dict[str, str]) -> str:
    """One progress line: each group's state from PostgreSQL and the receiver's stats."""
    calls = stats.get("per_endpoint", {})

    def req(name: str) -> int:
        return sum(int(calls.get(e, 0)) for e in g[name].endpoint_ids)

    h, f, d, c = st["healthy"], st["flaky"], st["dead"], st["cohort"]
    return (f"{el:5.1f}s healthy {h['delivered']}/{g['healthy'].expected} delivered"
            f" | flaky {f['delivered']}/{g['flaky'].expected} delivered ({req('flaky')} req)"
            f" | dead {d['exhausted'] + d['dead_lettered']}/{g['dead'].expected} dead-lettered"
            f" ({req('dead')} req, {d['quarantined']} in quarantine)"
            f" | cohort {phase['cohort'] or str(c['held']) + ' held'},"
            f" {c['delivered']}/{g['cohort'].expected} delivered"
            f" | replay {phase['replay']}")


def sample_ids(database_url: str, groups: Sequence[Group]) -> dict[str, str]:
    """One delivery id per group (the footer's example pages)."""
    out: dict[str, str] = {}
    with connect(database_url) as conn:
        for g in groups:
            if g.name == "replay":
                if g.delivery_ids:
                    out[g.name] = g.delivery_ids[0]
                continue
            r = conn.execute("SELECT delivery_id FROM deliveries WHERE endpoint_id = %s"
                             " ORDER BY created_at, delivery_id LIMIT 1",
                             (g.endpoint_ids[0],)).fetchone()
            if r is not None:
                out[g.name] = str(r[0])
    return out


def receiver_view(received: list[dict[str, Any]], g: Group, keys: dict[str, str]) -> Seen:
    """What the receiver saw of the group: requests, unique webhook-ids, and ``early``
    (cohort: requests before the release; replay: replayed deliveries not received again
    with their original idempotency key). ``keys``: delivery_id -> idempotency key."""
    c = Seen()
    if g.name == "replay":
        wanted = {keys[d] for d in g.delivery_ids if d in keys}
        again = Counter(r["idempotency_key"] for r in received
                        if r["at"] >= g.since and r["idempotency_key"] in wanted)
        c.requests = sum(again.values())
        c.unique = len(again)
        c.early = len(wanted - set(again)) + (len(g.delivery_ids) - len(wanted))
        return c
    eps = set(g.endpoint_ids)
    mine = [r for r in received if r["endpoint_id"] in eps]
    c.requests = len(mine)
    c.unique = len({r["webhook_id"] for r in mine})
    c.bad_signatures = sum(1 for r in mine if r["signature"] == "bad")
    if g.name == "cohort":
        c.early = sum(1 for r in mine if r["at"] < g.since)
    return c


def check(g: Group, c: Counts, seen: Seen, replayed: int) -> list[str]:
    """What is wrong with the group's counts (empty: it showed what it should)."""
    n = g.expected
    want: list[tuple[str, int, int]] = [("deliveries", c.deliveries, n)]
    if g.name == "healthy":
        want += [("delivered", c.delivered, n), ("attempts", c.attempts, n),
                 ("retried", c.retried, 0), ("dead-lettered", c.dead_lettered, 0),
                 ("receiver requests", seen.requests, n + replayed),
                 ("receiver unique ids", seen.unique, n)]
    elif g.name == "flaky":
        want += [("delivered", c.delivered, n), ("retried", c.retried, n),
                 ("attempts", c.attempts, n * g.attempts_each),
                 ("receiver requests", seen.requests, c.attempts),
                 ("receiver unique ids", seen.unique, n)]
    elif g.name == "dead":
        want += [("dead-lettered", c.dead_lettered, n), ("exhausted", c.exhausted, n),
                 ("delivered", c.delivered, 0), ("attempts", c.attempts, n * g.attempts_each),
                 ("receiver requests", seen.requests, c.attempts)]
    elif g.name == "cohort":
        want += [("held", c.held, n), ("held as retrodated", c.held_retrodated, n),
                 ("released", c.released, n), ("delivered", c.delivered, n),
                 ("release attempts", c.release_attempts, n), ("attempts", c.attempts, n),
                 ("receiver requests before the release", seen.early, 0),
                 ("receiver unique ids", seen.unique, n)]
    else:  # replay
        want += [("replayed", c.replayed, n), ("replay attempts", c.attempts, n),
                 ("delivered", c.delivered, n), ("received again", seen.unique, n),
                 ("not received again", seen.early, 0)]
    problems = [f"{what} {got} (expected {exp})" for what, got, exp in want if got != exp]
    if g.name == "dead" and c.quarantined < 1:
        problems.append("no delivery was quarantined (the breaker never opened)")
    if seen.bad_signatures:
        problems.append(f"{seen.bad_signatures} requests with a bad signature")
    return problems


_HEAD = ("GROUP", "DELIVERIES", "ATTEMPTS", "DELIVERED", "RETRIED", "QUARANTINED",
         "DEAD-LETTERED", "HELD", "RELEASED", "REPLAYED", "RECEIVER", "CHECK")


def render_table(rows: Sequence[Row]) -> str:
    """The table: one row per group; RECEIVER is requests/unique webhook-ids it saw (replay:
    deliveries received again with their original idempotency key)."""
    lines: list[tuple[str, ...]] = [_HEAD]
    for r in rows:
        c, seen = r.counts, r.receiver
        lines.append((r.group, str(c.deliveries), str(c.attempts), str(c.delivered),
                      str(c.retried), str(c.quarantined), str(c.dead_lettered), str(c.held),
                      str(c.released), str(c.replayed), f"{seen.requests}/{seen.unique}",
                      "OK" if not r.problems else "FAIL"))
    widths = [max(len(x[i]) for x in lines) for i in range(len(_HEAD))]
    out = ["  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                     for i, (v, w) in enumerate(zip(x, widths, strict=True)))
           for x in lines]
    for r in rows:
        out += [f"  {r.group}: {p}" for p in r.problems]
    return "\n".join(out)


def where_to_see(groups: Sequence[Group], console: str, metrics: dict[str, str],
                 job_id: str | None, sample: dict[str, str]) -> list[str]:
    """The footer: a console page per group, the stages' metrics, the SQL of the attempt
    log. ``sample``: group -> one delivery id of it."""
    by = {g.name: g for g in groups}
    out = ["where to see it (console pages: sign in first; they answer while the console"
           " runs, see --keep-console):"]
    pages = {
        "healthy": f"{console}/deliveries?app={by['healthy'].apps[0]}"
                   f"  (one of {len(by['healthy'].apps)} apps)",
        "flaky": f"{console}/deliveries?endpoint={by['flaky'].endpoint_ids[0]}",
        "dead": f"{console}/dead-letters  and  {console}/deliveries?endpoint="
                f"{by['dead'].endpoint_ids[0]}&status=exhausted",
        "cohort": f"{console}/deliveries?endpoint={by['cohort'].endpoint_ids[0]}  (held,"
                  f" then released: {console}/held  {console}/audit)",
        "replay": f"{console}/replays/{job_id}" if job_id else f"{console}/deliveries",
    }
    for name in GROUPS:
        out.append(f"  {name:<8} {pages[name]}")
        if name in sample and name in ("flaky", "dead", "cohort"):
            out.append(f"  {'':<8} {console}/deliveries/{sample[name]}  (its attempts)")
    out.append("  metrics  " + "  ".join(f"{k} {v}" for k, v in metrics.items()))
    flaky = sample.get("flaky", "<delivery_id>")
    out += [
        "  attempt log (psql \"$POSTBACKS_DATABASE_URL\"):",
        "    SELECT attempt_no, trigger, result, status_code, error_class, attempted_at"
        f" FROM delivery_attempts WHERE delivery_id = '{flaky}' ORDER BY attempt_no;",
        "    SELECT kind, count(*) FROM delivery_outcomes WHERE endpoint_id = "
        f"'{by['dead'].endpoint_ids[0]}' GROUP BY kind;",
    ]
    return out
