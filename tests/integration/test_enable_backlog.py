"""``postbacks endpoints enable --backlog deliver|skip`` resolves the whole parked backlog,
in rounds of ``ENABLE_ROUND``. It used to resolve one round (10,000) and report success:
the rest stayed parked, left out of the held-depth gauge, with no alert."""

from __future__ import annotations

import time

import pytest

from postbacks.db.anomaly import held_deliveries
from postbacks.db.connect import connect
from postbacks.settings import Settings
from postbacks.tools.seed import seed_endpoints
from replay_console import endpoints_cli
from streams.delivery import PARKED
from tests.integration.anomaly_helpers import held_delivery, insert_deliveries, run_cli


def test_enable_skip_rejects_every_parked_delivery_in_rounds(
    settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (ep,) = seed_endpoints(settings, apps=1, endpoints_per_app=1,
                           receiver_url="http://127.0.0.1:9", namespace=namespace,
                           now_ms=int(time.time() * 1000))
    with connect(settings.database_url) as conn:
        conn.execute("UPDATE endpoints SET disabled_at = now(), disabled_reason = 'test'"
                     " WHERE endpoint_id = %s", (ep.endpoint_id,))
    parked = [held_delivery(namespace, i, endpoint=ep.endpoint_id, app=ep.app_id)
              for i in range(5)]
    insert_deliveries(settings, parked, reason=PARKED)
    monkeypatch.setattr(endpoints_cli, "ENABLE_ROUND", 2)

    code = run_cli(monkeypatch, settings, "endpoints", "enable", ep.endpoint_id,
                   "--backlog", "skip", "--actor", "alice")
    out = capsys.readouterr().out
    assert code == 0, out
    assert "rejected 5 parked deliveries (never sent)" in out, out
    with connect(settings.database_url) as conn:
        assert held_deliveries(conn, endpoint_id=ep.endpoint_id, reason=PARKED) == []
