"""A delivery's page offers Suppress only where suppressing works: an exhausted or
dead-lettered delivery, to a role that may. It offered it on failing and quarantined
deliveries too, and every such submit was refused (409)."""

from __future__ import annotations

from postbacks.settings import Settings
from tests.integration.console_util import (
    Client,
    console_server,
    endpoint_with_deliveries,
    token,
)


def test_suppress_is_offered_only_where_it_works(settings: Settings, namespace: str) -> None:
    ns = namespace
    statuses = {"failing": 400, "quarantined": 401, "exhausted": 402, "dead_lettered": 403}
    _ep, app = endpoint_with_deliveries(settings, ns, "sup",
                                        {s: [n] for s, n in statuses.items()})
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
