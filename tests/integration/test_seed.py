"""Re-seeding an endpoint replaces its signing secret: one active secret, one signature."""

from __future__ import annotations

import time

from postbacks.core.endpoint import active_keys
from postbacks.core.signing import decode_secret
from postbacks.db.connect import connect
from postbacks.db.crypto import SecretBox
from postbacks.db.endpoints import load_endpoints
from postbacks.settings import Settings
from postbacks.tools.seed import seed_endpoints


def test_reseeding_leaves_only_the_fresh_secret_active(settings: Settings,
                                                        namespace: str) -> None:
    seeded = []
    for i in range(3):
        seeded = seed_endpoints(settings, apps=1, endpoints_per_app=1,
                                receiver_url="http://127.0.0.1:9", namespace=namespace,
                                now_ms=int(time.time() * 1000) + i)
    ep_id = seeded[0].endpoint_id
    with connect(settings.database_url) as conn:
        total = conn.execute("SELECT count(*) FROM endpoint_secrets WHERE endpoint_id = %s",
                             (ep_id,)).fetchone()
        (ep,) = load_endpoints(conn, SecretBox(settings.secrets_key.reveal()), only=ep_id)
    assert total == (3,)  # the old ones stay on record, ended
    keys = active_keys(ep, int(time.time() * 1000) + 1000)
    assert keys == [decode_secret(seeded[0].secret)]


def test_a_secret_scheduled_for_later_is_left_alone(settings: Settings, namespace: str) -> None:
    """Ending the other secrets never gives one an end before its start (the table's check
    constraint would refuse the whole rotation)."""
    import datetime as dt

    from postbacks.core.signing import generate_secret
    from postbacks.db.endpoints import add_secret

    (first,) = seed_endpoints(settings, apps=1, endpoints_per_app=1,
                              receiver_url="http://127.0.0.1:9", namespace=namespace,
                              now_ms=int(time.time() * 1000))
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    with connect(settings.database_url) as conn:
        box = SecretBox(settings.secrets_key.reveal())
        scheduled = add_secret(conn, box, first.endpoint_id, generate_secret(),
                               active_from=later, now_ms=int(time.time() * 1000))
        conn.commit()
    seed_endpoints(settings, apps=1, endpoints_per_app=1, receiver_url="http://127.0.0.1:9",
                   namespace=namespace, now_ms=int(time.time() * 1000) + 1)
    with connect(settings.database_url) as conn:
        row = conn.execute("SELECT active_until FROM endpoint_secrets WHERE secret_id = %s",
                           (scheduled,)).fetchone()
    assert row == (None,)
