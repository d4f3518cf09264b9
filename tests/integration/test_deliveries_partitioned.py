"""``deliveries`` partitioned by day of creation (schema 0010) against PostgreSQL: the
migration moves every stored row, a delivery stored again (same id, later creation time;
the same identity planned again gets the same id) stays one row through the sink and the
backfill import, SQL by hand goes through the guard trigger, lookups by id find a row in
its day's partition, and retention drops expired deliveries partitions with their keys,
keeps the window and never drops the default partition."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from importlib import resources
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from postbacks.core.backfill import Candidate
from postbacks.core.endpoint import Endpoint
from postbacks.core.fanout import plan_deliveries
from postbacks.db.connect import connect, scratch_database
from postbacks.db.delivery_keys import BY_ID
from postbacks.db.migrate import migrate
from postbacks.db.retention import delivery_partitions, drop_expired
from replay_console.backfill import _write as backfill_write
from sinks.tables import STAGING_DDL, TABLES, column_types, use_orjson
from tests.unit.factories import make_conversion

OLD = (dt.date(2001, 2, 1), dt.date(2001, 2, 2))  # days no other test writes deliveries on
_COLS = ("delivery_id, endpoint_id, app_id, conversion_id, event_type, goal_id, event_id,"
         " idempotency_key, payout_usd_micros, snapshot, created_at")


@pytest.fixture()
def fresh_db(service_env: dict[str, str]) -> Iterator[str]:
    """An empty database of its own on the test server; its URL. Dropped afterwards."""
    with scratch_database(service_env["POSTBACKS_DATABASE_URL"],
                          f"part_{uuid.uuid4().hex[:10]}") as url:
        yield url


def _insert(conn: psycopg.Connection[Any], did: str, created: dt.datetime, *,
            conversion: str | None = None, endpoint: str = "ep_part") -> list[Any]:
    conv = conversion or f"cv_{did}"
    return conn.execute(
        f"INSERT INTO deliveries ({_COLS}) VALUES (%s, %s, 'app_part', %s, 'install', NULL,"
        " %s, %s, 1000, %s, %s) ON CONFLICT DO NOTHING RETURNING delivery_id",
        (did, endpoint, conv, f"ev_{did}", f"k_{did}", Jsonb({"conversion_id": conv}),
         created)).fetchall()


def _apply_until_0009(url: str) -> None:
    """The schema as releases before 0010 left it (bookkeeping in schema_migrations, which
    ``migrate`` takes over and upgrades from)."""
    files = sorted(e for e in (resources.files("postbacks") / "db" / "migrations").iterdir()
                   if e.name.endswith(".sql") and e.name < "0010")
    with psycopg.connect(url) as conn:
        for f in files:
            conn.execute(f.read_text())  # type: ignore[arg-type]
        conn.execute("CREATE TABLE schema_migrations (version integer PRIMARY KEY)")
        conn.execute("INSERT INTO schema_migrations SELECT generate_series(1, %s)", (len(files),))


def test_the_migration_moves_every_row_into_day_partitions(fresh_db: str) -> None:
    _apply_until_0009(fresh_db)
    now = dt.datetime.now(dt.UTC)
    days = [now - dt.timedelta(days=n) for n in (40, 3, 0)]
    with psycopg.connect(fresh_db) as conn:
        for i in range(300):
            _insert(conn, f"dlv_m{i}", days[i % 3] + dt.timedelta(seconds=i))
        conn.execute("UPDATE deliveries SET status = 'delivered', attempt_count = 2"
                     " WHERE delivery_id = 'dlv_m7'")
        before = conn.execute("SELECT * FROM deliveries ORDER BY delivery_id").fetchall()
    migrate(fresh_db)
    with psycopg.connect(fresh_db) as conn:
        after = conn.execute("SELECT * FROM deliveries ORDER BY delivery_id").fetchall()
        kind = conn.execute("SELECT relkind FROM pg_class WHERE relname = 'deliveries'"
                            ).fetchone()
        default_rows = conn.execute("SELECT count(*) FROM deliveries_default").fetchone()
        keys = conn.execute("SELECT count(*) FROM delivery_keys").fetchone()
        parts = {n for n, _d in delivery_partitions(conn)}
        status = conn.execute("SELECT status, attempt_count FROM deliveries WHERE " + BY_ID,
                              {"id": "dlv_m7"}).fetchone()
    assert len(before) == 300 and after == before  # every row, every column
    assert kind == ("p",)
    assert default_rows == (0,)  # each stored day got its partition
    assert keys == (300,)
    assert {f"deliveries_{d:%Y%m%d}" for d in days} <= parts
    assert status == ("delivered", 2)


def _row(d: str, at: dt.datetime) -> tuple[Any, ...]:
    return (d, "ep_part", "app_part", f"cv_{d}", "install", None, f"ev_{d}", f"k_{d}",
            1000, {"conversion_id": d}, at, "pending", None, None, None, 0, None)


def _sink_conn(url: str) -> psycopg.Connection[Any]:
    conn = connect(url)
    use_orjson(conn)
    conn.execute(STAGING_DDL)
    return conn


def test_the_sink_skips_a_redelivered_record_and_counts_it(migrated: dict[str, str]) -> None:
    url = migrated["POSTBACKS_DATABASE_URL"]
    t = TABLES["deliveries"]
    did = f"dlv_sink_{uuid.uuid4().hex[:10]}"
    created = dt.datetime.now(dt.UTC).replace(microsecond=0)
    later = created + dt.timedelta(hours=30)  # planned again: another day's partition
    with _sink_conn(url) as conn:
        types = column_types(conn)["deliveries"]
        assert t.write(conn, [_row(did, created)], types=types) == (1, False)
        for direct in (True, False):  # the direct COPY and the staging path
            got = t.write(conn, [_row(did, later), _row(f"{did}_n{direct}", later)],
                          types=types, direct=direct)
            assert got == (1, True)
        # one batch holding the delivery twice, each copy with its own creation time
        twice = [_row(f"{did}_t", later), _row(f"{did}_t", created)]
        assert t.write(conn, twice, types=types) == (1, True)
        rows = conn.execute("SELECT delivery_id, created_at FROM deliveries"
                            " WHERE delivery_id LIKE %s ORDER BY 1", (did + "%",)).fetchall()
        keys = conn.execute("SELECT delivery_id, created_at FROM delivery_keys"
                            " WHERE delivery_id LIKE %s ORDER BY 1", (did + "%",)).fetchall()
        conn.commit()
    assert rows[0] == (did, created) and len(rows) == 4
    assert {r[0] for r in rows} == {did, f"{did}_nTrue", f"{did}_nFalse", f"{did}_t"}
    assert keys == rows  # each row's key names its creation time


def test_the_same_identity_planned_again_is_the_same_row(migrated: dict[str, str]) -> None:
    """Fan-out derives the id from the identity (endpoint, conversion, event type, goal):
    a conversion fanned out again after a crash is the same delivery, stored once."""
    url = migrated["POSTBACKS_DATABASE_URL"]
    ep = Endpoint(f"ep_part_{uuid.uuid4().hex[:8]}", "app_part", "https://x.test/h",
                  frozenset({"*"}))
    conv = make_conversion(conversion_id=f"cv_{uuid.uuid4().hex[:10]}", app_id="app_part")
    now_ms = int(dt.datetime.now(dt.UTC).timestamp() * 1000)
    first = plan_deliveries(conv, [ep], idem_key=b"k" * 32, now_ms=now_ms)
    again = plan_deliveries(make_conversion(**{**conv, "event_id": "evt_again"}), [ep],
                            idem_key=b"k" * 32, now_ms=now_ms + 86_400_000)
    t = TABLES["deliveries"]
    with _sink_conn(url) as conn:
        types = column_types(conn)["deliveries"]
        assert t.write(conn, [t.row(first[0])], types=types) == (1, False)
        assert t.write(conn, [t.row(again[0])], types=types) == (0, True)
        rows = conn.execute("SELECT delivery_id, event_id FROM deliveries"
                            " WHERE endpoint_id = %s", (ep.endpoint_id,)).fetchall()
        conn.commit()
    assert rows == [(first[0]["delivery_id"], conv["event_id"])]


def test_the_backfill_import_skips_a_stored_delivery(migrated: dict[str, str]) -> None:
    url = migrated["POSTBACKS_DATABASE_URL"]
    ep = Endpoint(f"ep_part_{uuid.uuid4().hex[:8]}", "app_part", "https://x.test/h",
                  frozenset({"*"}))
    stored = f"dlv_bf_{uuid.uuid4().hex[:10]}"
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    with _sink_conn(url) as conn:
        t = TABLES["deliveries"]
        assert t.write(conn, [_row(stored, now)], types=column_types(conn)["deliveries"]
                       ) == (1, False)
        old_ms = int((now - dt.timedelta(days=3)).timestamp() * 1000)
        cands = [Candidate(line=n, legacy_id=f"legacy_{n}", endpoint_id=ep.endpoint_id,
                           delivery_id=did,
                           conversion=make_conversion(conversion_id=did, app_id="app_part"),
                           created_at_ms=old_ms, last_error="boom", app_given=False)
                 for n, did in enumerate((stored, stored + "_new"), start=1)]
        made = backfill_write(conn, [(c, ep, f"msg_{c.delivery_id}") for c in cands],
                              "test", int(now.timestamp() * 1000))
        rows = conn.execute("SELECT delivery_id, created_at, status FROM deliveries"
                            " WHERE delivery_id LIKE %s ORDER BY 1", (stored + "%",)).fetchall()
        conn.rollback()
    assert made == {stored + "_new"}
    assert rows == [(stored, now, "pending"),
                    (stored + "_new", now - dt.timedelta(days=3), "dead_lettered")]


def test_sql_by_hand_goes_through_the_guard(migrated: dict[str, str]) -> None:
    url = migrated["POSTBACKS_DATABASE_URL"]
    did = f"dlv_hand_{uuid.uuid4().hex[:10]}"
    first = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    with connect(url) as conn:
        assert _insert(conn, did, first) == [(did,)]
        key = conn.execute("SELECT created_at FROM delivery_keys WHERE delivery_id = %s",
                           (did,)).fetchone()
        assert _insert(conn, did, first) == []  # the same row again: skipped
        conn.commit()
        # planned again after a crash: same id, later creation time (another partition)
        with pytest.raises(psycopg.errors.UniqueViolation, match="stored already"):
            _insert(conn, did, first + dt.timedelta(days=1, minutes=5))
        conn.rollback()
        rows = conn.execute("SELECT created_at FROM deliveries WHERE delivery_id = %s",
                            (did,)).fetchall()
        conn.execute("DELETE FROM deliveries WHERE delivery_id = %s", (did,))
        gone = conn.execute("SELECT count(*) FROM delivery_keys WHERE delivery_id = %s",
                            (did,)).fetchone()
        conn.rollback()
    assert key == (first,)
    assert rows == [(first,)]
    assert gone == (0,)  # a deleted row's key goes with it


def test_lookups_by_id_read_only_the_rows_day_partition(migrated: dict[str, str]) -> None:
    url = migrated["POSTBACKS_DATABASE_URL"]
    did = f"dlv_look_{uuid.uuid4().hex[:10]}"
    with connect(url) as conn:
        conn.execute("SELECT postbacks_ensure_attempt_partitions(current_date - 1, 9)")
        _insert(conn, did, dt.datetime.now(dt.UTC))
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF)"
            " SELECT status FROM deliveries WHERE " + BY_ID, {"id": did}).fetchall())
        found = conn.execute("SELECT delivery_id FROM deliveries WHERE " + BY_ID,
                             {"id": did}).fetchall()
        conn.rollback()
    assert found == [(did,)]
    scanned = [ln for ln in plan.splitlines() if " on deliveries_" in ln
               and "never executed" not in ln]
    assert len(scanned) == 1, plan


def test_an_update_of_created_at_moves_the_row_with_its_key(
        migrated: dict[str, str]) -> None:
    url = migrated["POSTBACKS_DATABASE_URL"]
    did = f"dlv_move_{uuid.uuid4().hex[:10]}"
    now = dt.datetime.now(dt.UTC)
    earlier = now - dt.timedelta(days=2)
    with connect(url) as conn:
        conn.execute("SELECT postbacks_ensure_attempt_partitions(current_date - 3, 4)")
        _insert(conn, did, now)
        conn.execute("UPDATE deliveries SET created_at = %s WHERE delivery_id = %s",
                     (earlier, did))
        found = conn.execute("SELECT created_at FROM deliveries WHERE " + BY_ID,
                             {"id": did}).fetchall()
        keys = conn.execute("SELECT created_at FROM delivery_keys WHERE delivery_id = %s",
                            (did,)).fetchall()
        again = _insert(conn, did, earlier)  # the row as it is now: skipped
        with pytest.raises(psycopg.errors.UniqueViolation):
            _insert(conn, did, now)  # its old creation time is no key any more
        conn.rollback()
    assert found == [(earlier,)]
    assert keys == [(earlier,)]
    assert again == []


def _old_rows(url: str) -> list[str]:
    ids = [f"dlv_old_{uuid.uuid4().hex[:8]}_{i}" for i in range(3)]
    with connect(url) as conn:
        conn.execute("SELECT postbacks_ensure_attempt_partitions(%s, 2)", (OLD[0],))
        for i, did in enumerate(ids):
            _insert(conn, did, dt.datetime.combine(OLD[i % 2], dt.time(12), dt.UTC))
        conn.commit()
    return ids


def test_retention_drops_expired_deliveries_partitions_with_their_keys(
        migrated: dict[str, str]) -> None:
    url = migrated["POSTBACKS_DATABASE_URL"]
    ids = _old_rows(url)
    today = dt.datetime.now(dt.UTC).date()
    old = {f"deliveries_{d:%Y%m%d}" for d in OLD}
    dry = drop_expired(url, keep_days=90, today=today, dry_run=True)
    listed = {x.name for x in dry}
    assert old <= listed and {f"delivery_attempts_{d:%Y%m%d}" for d in OLD} <= listed
    with connect(url) as conn:
        assert old <= {n for n, _d in delivery_partitions(conn)}, "a dry run dropped one"
    actor = f"test-retention-{uuid.uuid4().hex[:8]}"
    done = drop_expired(url, keep_days=90, today=today, actor=actor)
    assert old <= {x.name for x in done if x.dropped}
    with connect(url) as conn:
        names = {n for n, _d in delivery_partitions(conn)}
        audit = conn.execute(
            "SELECT target_type, target_id, before->>'rows', before->>'keys' FROM audit_log"
            " WHERE actor = %s"
            " AND action = 'drop_partition' AND target_id = ANY(%s) ORDER BY target_id",
            (actor, sorted(old))).fetchall()
        keys = conn.execute("SELECT count(*) FROM delivery_keys WHERE delivery_id = ANY(%s)",
                            (ids,)).fetchone()
        default = conn.execute("SELECT to_regclass('deliveries_default')").fetchone()
        # the ids are free again: a delivery planned anew is stored
        again = _insert(conn, ids[0], dt.datetime.now(dt.UTC))
        conn.rollback()
    assert not old & names and f"deliveries_{today:%Y%m%d}" in names  # the window stays
    assert audit == [("delivery_partition", f"deliveries_{OLD[0]:%Y%m%d}", "2", "2"),
                     ("delivery_partition", f"deliveries_{OLD[1]:%Y%m%d}", "1", "1")]
    assert keys == (0,)
    assert default is not None and default[0] is not None  # never dropped
    assert again == [(ids[0],)]


def test_retention_takes_the_deliveries_outcomes_suppressions_and_old_dead_letters(
        migrated: dict[str, str]) -> None:
    """They grew for ever beside the dropped partitions (outcome rows of deliveries gone)."""
    url = migrated["POSTBACKS_DATABASE_URL"]
    ids = _old_rows(url)
    fresh = f"dlv_new_{uuid.uuid4().hex[:8]}"
    now = dt.datetime.now(dt.UTC)
    old_at = dt.datetime.combine(OLD[0], dt.time(12), dt.UTC)
    tag = uuid.uuid4().hex[:8]
    with connect(url) as conn:
        _insert(conn, fresh, now)
        for did in [*ids, fresh]:
            conn.execute("INSERT INTO delivery_outcomes (outcome_id, delivery_id, endpoint_id,"
                         " app_id, kind, attempt_no, occurred_at) VALUES (%s, %s, 'ep_part',"
                         " 'app_part', 'delivered', 1, %s)", (f"out_{did}", did, now))
            conn.execute("INSERT INTO postback_suppressions (delivery_id, endpoint_id, reason)"
                         " VALUES (%s, 'ep_part', 'render_failed: test')", (did,))
        for name, at in (("old", old_at), ("new", now)):
            conn.execute("INSERT INTO dead_letters (dead_letter_id, reason, error_class,"
                         " error_message, stage, origin_topic, origin_partition, origin_offset,"
                         " occurred_at) VALUES (%s, 'permanent', 'X', 'x', 'agent', 't', 0, 0,"
                         " %s)", (f"dlq_{tag}_{name}", at))
        conn.commit()
    today = now.date()
    dry = drop_expired(url, keep_days=90, today=today, dry_run=True)
    assert [x.name for x in dry if x.name == "dead_letters" and x.rows >= 1]
    drop_expired(url, keep_days=90, today=today)
    with connect(url) as conn:
        outcomes = conn.execute("SELECT delivery_id FROM delivery_outcomes WHERE delivery_id ="
                                " ANY(%s)", ([*ids, fresh],)).fetchall()
        suppressed = conn.execute("SELECT delivery_id FROM postback_suppressions WHERE"
                                  " delivery_id = ANY(%s)", ([*ids, fresh],)).fetchall()
        dead = conn.execute("SELECT dead_letter_id FROM dead_letters WHERE dead_letter_id"
                            " LIKE %s", (f"dlq_{tag}_%",)).fetchall()
    assert outcomes == [(fresh,)] and suppressed == [(fresh,)]
    assert dead == [(f"dlq_{tag}_new",)]


def test_a_day_with_rows_in_the_default_partition_is_left_to_it(
        migrated: dict[str, str]) -> None:
    url = migrated["POSTBACKS_DATABASE_URL"]
    day = dt.date(2099, 3, 1) + dt.timedelta(days=uuid.uuid4().int % 300)
    did = f"dlv_future_{uuid.uuid4().hex[:10]}"
    with connect(url) as conn:
        _insert(conn, did, dt.datetime.combine(day, dt.time(1), dt.UTC))
        made = conn.execute("SELECT postbacks_ensure_attempt_partitions(%s, 1)",
                            (day,)).fetchone()
        where = conn.execute("SELECT tableoid::regclass::text FROM deliveries"
                             " WHERE delivery_id = %s", (did,)).fetchone()
        conn.rollback()
    assert made == (1,)  # the attempts partition, not the deliveries one
    assert where == ("deliveries_default",)


def test_the_held_depth_counts_deliveries_for_review_not_those_parked(
        migrated: dict[str, str]) -> None:
    """A disabled endpoint's parked deliveries (hold reason endpoint_disabled) are held
    too, but wait for the endpoint: counting them paged reviewers for ever."""
    from streams.anomaly_gate.refresh import _probe

    url = migrated["POSTBACKS_DATABASE_URL"]
    now = dt.datetime.now(dt.UTC)
    with connect(url) as conn:
        before = _probe(conn)[1]
        for n, reason in enumerate(("retrodated", "endpoint_disabled", "endpoint_disabled")):
            did = f"dlv_held_{uuid.uuid4().hex[:8]}_{n}"
            _insert(conn, did, now)
            conn.execute("UPDATE deliveries SET status = 'held', held_at = %s, hold_reason = %s"
                         " WHERE delivery_id = %s", (now, reason, did))
        after = _probe(conn)[1]
        conn.rollback()
    assert after - before == 1
