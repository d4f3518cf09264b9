"""Endpoint signing secrets are encrypted at rest and decrypt only with the right key."""

from __future__ import annotations

import time
from typing import Any

import pytest

from postbacks.core.signing import decode_secret, generate_secret
from postbacks.db.connect import connect
from postbacks.db.crypto import SecretBox
from postbacks.db.endpoints import add_secret, load_endpoints, upsert_endpoint
from postbacks.errors import ConfigError
from postbacks.settings import Settings


def test_secrets_are_ciphertext_in_postgres_and_round_trip(settings: Settings,
                                                           namespace: str) -> None:
    box = SecretBox(settings.secrets_key.reveal())
    secret = generate_secret()
    ep = f"ep_{namespace}_sec"
    with connect(settings.database_url) as conn:
        upsert_endpoint(conn, endpoint_id=ep, app_id=f"app_{namespace}", url="https://x.example/")
        add_secret(conn, box, ep, secret, now_ms=int(time.time() * 1000))
        conn.commit()
        [stored] = conn.execute("SELECT ciphertext FROM endpoint_secrets WHERE endpoint_id = %s",
                                (ep,)).fetchone() or [None]
        assert stored is not None
        assert secret.encode() not in bytes(stored)
        assert decode_secret(secret) not in bytes(stored)
        [loaded] = [e for e in load_endpoints(conn, box) if e.endpoint_id == ep]
        assert [s.key for s in loaded.secrets] == [decode_secret(secret)]
        wrong = SecretBox("QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=")
        with pytest.raises(ConfigError, match="wrong POSTBACKS_SECRETS_KEY"):
            load_endpoints(conn, wrong)


def test_a_malformed_secret_is_refused_before_it_is_stored(settings: Settings,
                                                           namespace: str) -> None:
    box = SecretBox(settings.secrets_key.reveal())
    ep = f"ep_{namespace}_bad"
    with connect(settings.database_url) as conn:
        upsert_endpoint(conn, endpoint_id=ep, app_id=f"app_{namespace}", url="https://x.example/")
        with pytest.raises(ValueError, match="whsec_"):
            add_secret(conn, box, ep, "not-a-secret", now_ms=0)
        conn.rollback()


def _with_hand_written_secret(conn: Any, endpoint_id: str, secret_id: str,
                              raw: bytes) -> None:
    """Endpoint ``endpoint_id`` with a secret row written by hand: ``raw`` where the sealed
    secret belongs, active since an hour ago."""
    upsert_endpoint(conn, endpoint_id=endpoint_id, app_id=f"app_{endpoint_id}",
                    url="https://x.example/")
    conn.execute("INSERT INTO endpoint_secrets (secret_id, endpoint_id, ciphertext,"
                 " active_from) VALUES (%s, %s, %s, now() - interval '1 hour')",
                 (secret_id, endpoint_id, raw))


def test_one_secret_row_that_does_not_open_fails_its_endpoint_only(settings: Settings,
                                                                   namespace: str) -> None:
    """A secret row written by hand (plaintext, or sealed under another environment's key):
    its endpoint loads with a config error (its deliveries fail to render, loudly), every
    other endpoint loads as before. Before, the whole load failed: the stages kept a stale
    view for ever, or did not start, blaming the key."""
    box = SecretBox(settings.secrets_key.reveal())
    good, bad = f"ep_{namespace}_good", f"ep_{namespace}_hand"
    secret = generate_secret()
    with connect(settings.database_url) as conn:  # one transaction, rolled back
        upsert_endpoint(conn, endpoint_id=good, app_id=f"app_{namespace}",
                        url="https://x.example/")
        add_secret(conn, box, good, secret, now_ms=int(time.time() * 1000))
        _with_hand_written_secret(conn, bad, f"sec_{namespace}_hand", secret.encode())
        loaded = {e.endpoint_id: e for e in load_endpoints(conn, box)
                  if e.endpoint_id in (good, bad)}
        conn.rollback()
    assert [s.key for s in loaded[good].secrets] == [decode_secret(secret)]
    assert loaded[good].config_error is None
    assert loaded[bad].secrets == ()
    assert f"sec_{namespace}_hand cannot be used" in (loaded[bad].config_error or "")


def test_a_secret_that_does_not_open_beside_one_that_does_is_left_out(
        settings: Settings, namespace: str) -> None:
    """Rotating a bad secret away keeps it active for the overlap: meanwhile its endpoint
    signs with the secret that opens (the bad one left out), and a load of that endpoint
    alone whose one secret does not open is a config error, not a wrong key."""
    box = SecretBox(settings.secrets_key.reveal())
    ep, lone = f"ep_{namespace}_rot", f"ep_{namespace}_lone"
    secret = generate_secret()
    with connect(settings.database_url) as conn:  # one transaction, rolled back
        for e in (ep, lone):
            _with_hand_written_secret(conn, e, f"sec_{e}_hand", b"whsec_written_by_hand")
        add_secret(conn, box, ep, secret, now_ms=int(time.time() * 1000))
        [rotated] = load_endpoints(conn, box, only=ep)
        [alone] = load_endpoints(conn, box, only=lone)
        conn.rollback()
    assert rotated.config_error is None
    assert [s.key for s in rotated.secrets] == [decode_secret(secret)]
    assert alone.secrets == () and "cannot be used" in (alone.config_error or "")
