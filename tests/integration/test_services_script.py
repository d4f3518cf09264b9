"""deploy/local/services.sh against a port another process holds: ``up`` stops with a clear
line naming the port and the variable that moves it, before it starts anything (it used to
start PostgreSQL and then fail on the broker's port, leaving PostgreSQL running alone).
Run with a state directory and ports of its own, beside the services the suite uses."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from postbacks.tools.procs import free_port

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "local" / "services.sh"


def _open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("busy_var", ["POSTBACKS_KAFKA_PORT",
                                      "POSTBACKS_KAFKA_CONTROLLER_PORT"])
def test_up_refuses_a_busy_broker_port_before_starting_anything(
        tmp_path: Path, busy_var: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        pg_port = free_port()
        env = {**os.environ, "POSTBACKS_STATE_DIR": str(tmp_path / "state"),
               "POSTBACKS_KAFKA_PORT": str(free_port()),
               "POSTBACKS_KAFKA_CONTROLLER_PORT": str(free_port()),
               "POSTBACKS_PG_PORT": str(pg_port), busy_var: str(port)}
        out = subprocess.run(["bash", str(SCRIPT), "up"], env=env, capture_output=True,
                             text=True, timeout=300, check=False)
    assert out.returncode != 0, out.stdout
    assert f"port 127.0.0.1:{port} is already in use" in out.stderr, out.stderr
    assert "POSTBACKS_KAFKA_PORT" in out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("\n") <= 3, out.stderr
    assert not _open(pg_port), "PostgreSQL was started"
    assert not (tmp_path / "state" / "pgdata").exists()
    assert not (tmp_path / "state" / "run" / "kafka.pid").exists()
