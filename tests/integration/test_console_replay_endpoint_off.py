"""A replay goes only to an endpoint that is there, switched on and not disabled by the
platform. It used to be queued anyway: the agent then dead-lettered it (unknown_endpoint)
or parked it, and a delivered delivery ended dead-lettered or held, out of the
publisher's sight, for a replay that could not be sent."""

from __future__ import annotations

from postbacks.db.connect import connect
from postbacks.db.endpoints import upsert_endpoint
from postbacks.settings import Settings
from tests.integration.console_util import (
    Client,
    console_server,
    endpoint_with_deliveries,
    token,
)


def test_a_replay_to_an_endpoint_that_is_off_is_refused(settings: Settings,
                                                         namespace: str) -> None:
    ns = namespace
    ep, app = endpoint_with_deliveries(settings, ns, "off", {"delivered": range(300, 303)})
    one = f"dlv_{ns}_300"
    with console_server(settings) as port:
        sup = Client(port, bearer=token(settings, f"sup-off-{ns}", "support"))
        for switch_off in ("UPDATE endpoints SET enabled = false WHERE endpoint_id = %s",
                           "UPDATE endpoints SET enabled = true, disabled_at = now()"
                           " WHERE endpoint_id = %s",
                           "DELETE FROM endpoints WHERE endpoint_id = %s"):
            with connect(settings.database_url) as conn:
                conn.execute(switch_off, (ep,))
                conn.commit()
            r = sup.post(f"/api/v1/deliveries/{one}/replay", body={})
            assert r.status == 409 and "endpoint_off" in r.text, (switch_off, r.text)
            pv = sup.get(f"/api/v1/replays/preview?app={app}").json()
            assert pv["by_status"] == {"endpoint_off": 3} and pv["replayable"] == 0, pv
            r = sup.post("/api/v1/replays", body={"filter": {"app": app}})
            assert r.status == 409 and "enable it first" in r.text, r.text
        with connect(settings.database_url) as conn:  # back, switched on: replayed
            upsert_endpoint(conn, endpoint_id=ep, app_id=app, url="https://pub.example/off")
            conn.commit()
        pv = sup.get(f"/api/v1/replays/preview?app={app}").json()
        assert pv["by_status"] == {"delivered": 3} and pv["replayable"] == 3, pv
        r = sup.post(f"/api/v1/deliveries/{one}/replay", body={})
        assert r.status == 202, r.text
        # the preview counts what a bulk replay would skip as it would: the one queued
        # (it counted it replayable, and the count it offered to confirm never matched)
        pv = sup.get(f"/api/v1/replays/preview?app={app}").json()
        assert pv["by_status"] == {"delivered": 2, "queued": 1} and pv["replayable"] == 2, pv
