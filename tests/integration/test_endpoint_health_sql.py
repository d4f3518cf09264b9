"""The sink's SQL merge of endpoint health is the pure rule's, and disable / enable keep
their promises (once, audited, history cleared) on the real PostgreSQL."""

from __future__ import annotations

import pytest

from postbacks.core.endpoint_health import BatchHealth, Health
from postbacks.db.connect import connect
from postbacks.db.endpoint_health import candidates, disable, enable, record_batch
from postbacks.db.endpoints import upsert_endpoint
from postbacks.db.times import ms_of, ts_of
from postbacks.settings import Settings
from tests.unit.test_endpoint_health import MERGE_CASES


@pytest.mark.parametrize("case", range(len(MERGE_CASES)))
def test_the_sql_merge_is_the_pure_rule(settings: Settings, namespace: str, case: int) -> None:
    stored, batch, want = MERGE_CASES[case]
    ep = f"ep_{namespace}_h{case}"
    with connect(settings.database_url) as conn:
        if stored is not None:
            conn.execute("INSERT INTO endpoint_health (endpoint_id, last_success_at,"
                         " failing_since, last_gone_at) VALUES (%s, %s, %s, %s)",
                         (ep, ts_of(stored.last_success_ms), ts_of(stored.failing_since_ms),
                          ts_of(stored.last_gone_ms)))
        record_batch(conn, {ep: batch})
        row = conn.execute("SELECT last_success_at, failing_since, last_gone_at"
                           " FROM endpoint_health WHERE endpoint_id = %s", (ep,)).fetchone()
        conn.rollback()
    assert row is not None
    assert Health(ms_of(row[0]), ms_of(row[1]), ms_of(row[2])) == want


def test_disable_once_with_an_audit_row_and_enable_clears_the_history(
    settings: Settings, namespace: str,
) -> None:
    ep = f"ep_{namespace}_dis"
    with connect(settings.database_url) as conn:
        upsert_endpoint(conn, endpoint_id=ep, app_id=f"app_{namespace}", url="http://127.0.0.1:9/")
        record_batch(conn, {ep: BatchHealth(None, 1_700_000_000_000, None)})
        conn.commit()
        assert ep in {c.endpoint_id for c in candidates(conn)}
        assert disable(conn, ep, "only failures") is True
        assert disable(conn, ep, "again") is False  # once
        assert ep not in {c.endpoint_id for c in candidates(conn)}
        assert enable(conn, ep, actor="ops@test", backlog="keep", note="fixed") == \
            "only failures"
        assert enable(conn, ep, actor="ops@test", backlog="keep", note=None) is None
        assert ep not in {c.endpoint_id for c in candidates(conn)}  # history cleared
        actions = [r[0] for r in conn.execute(
            "SELECT action FROM audit_log WHERE target_id = %s ORDER BY audit_id", (ep,))]
        assert actions[-2:] == ["endpoint.disabled", "endpoint.enabled"]
        state = conn.execute("SELECT disabled_at FROM endpoints WHERE endpoint_id = %s",
                             (ep,)).fetchone()
    assert state == (None,)
