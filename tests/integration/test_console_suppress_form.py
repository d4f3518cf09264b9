"""A delivery's page offers Suppress only where suppressing works: an exhausted or
dead-lettered delivery, to a role that may. It offered it on failing and quarantined
deliveries too, and every such submit was refused (409)."""

from __future__ import annotations

from postbacks.db.connect import connect
from postbacks.db.endpoints import upsert_endpoint
from postbacks.settings import Settings
from tests.integration.anomaly_helpers import held_delivery, insert_deliveries
from tests.integration.console_util import Client, console_server, token


def test_suppress_is_offered_only_where_it_works(settings: Settings, namespace: str) -> None:
    ns = namespace
    ep, app = f"ep_{ns}_sup", f"app_{ns}_sup"
    with connect(settings.database_url) as conn:
        upsert_endpoint(conn, endpoint_id=ep, app_id=app, url="https://pub.example/s")
        conn.commit()
    statuses = {"failing": 400, "quarantined": 401, "exhausted": 402, "dead_lettered": 403}
    for status, n in statuses.items():
        insert_deliveries(settings, [held_delivery(ns, n, endpoint=ep, app=app)],
                          status=status)
    with console_server(settings) as port:
        support = Client(port)
        support.sign_in(token(settings, f"sup-form-{ns}", "support"))
        publisher = Client(port)
        publisher.sign_in(token(settings, f"pub-form-{ns}", "publisher", (app,)))
        for status, n in statuses.items():
            html = support.get(f"/deliveries/dlv_{ns}_{n}").text
            offered = f'action="/deliveries/dlv_{ns}_{n}/suppress"' in html
            assert offered == (status in ("exhausted", "dead_lettered")), status
            page = publisher.get(f"/deliveries/dlv_{ns}_{n}")
            assert page.status == 200 and "/suppress" not in page.text, status
