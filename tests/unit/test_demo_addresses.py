"""The demo starts the services and then uses their addresses: with the ports moved
(POSTBACKS_KAFKA_PORT, POSTBACKS_PG_PORT, as the README says for ports in use) it used the
default ports, that is whatever else listened there."""

from __future__ import annotations

from pathlib import Path

import pytest

from postbacks.settings import load_settings
from postbacks.tools.services import script_addresses, with_script_addresses

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "local" / "services.sh"


def test_the_demo_takes_the_addresses_of_the_services_it_started(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSTBACKS_KAFKA_PORT", "29999")
    monkeypatch.setenv("POSTBACKS_PG_PORT", "25999")
    assert script_addresses(SCRIPT)["KAFKA_BOOTSTRAP_SERVERS"] == "127.0.0.1:29999"
    s = with_script_addresses(load_settings({}), SCRIPT, env={})
    assert s.kafka_bootstrap_servers == "127.0.0.1:29999"
    assert s.database_url == "postgresql://postbacks@127.0.0.1:25999/postbacks"
    # a broker or database named by the caller stays
    named = {"KAFKA_BOOTSTRAP_SERVERS": "10.0.0.1:9092"}
    s = with_script_addresses(load_settings(named), SCRIPT, env=named)
    assert s.kafka_bootstrap_servers == "10.0.0.1:9092"
    assert s.database_url.endswith(":25999/postbacks")
