"""``POSTBACKS_DENY_NETWORKS`` holds in every process the command line starts: an endpoint
saved from the command line to a denied address is refused, naming the setting, and
nothing is saved; the same URL is saved without it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from postbacks.core.ssrf import deny_networks
from postbacks.db.connect import connect
from postbacks.settings import Settings
from tests.integration.anomaly_helpers import run_cli


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    yield
    deny_networks("")  # (the command line set it for this test process)


def test_an_endpoint_to_a_denied_network_is_refused_from_the_command_line(
        settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    app = f"app_{namespace}_deny"
    monkeypatch.setenv("POSTBACKS_ALLOW_LOOPBACK_TARGETS", "true")
    monkeypatch.setenv("POSTBACKS_DENY_NETWORKS", "127.0.0.0/30")
    argv = ("endpoints", "create", "--app", app, "--url", "http://127.0.0.2:9/hook",
            "--actor", "admin:test", "--json")
    assert run_cli(monkeypatch, settings, *argv) != 0
    assert "POSTBACKS_DENY_NETWORKS" in capsys.readouterr().err
    with connect(settings.database_url) as conn:
        assert conn.execute("SELECT count(*) FROM endpoints WHERE app_id = %s",
                            (app,)).fetchone() == (0,)
    monkeypatch.setenv("POSTBACKS_DENY_NETWORKS", "")
    assert run_cli(monkeypatch, settings, *argv) == 0, capsys.readouterr().err
