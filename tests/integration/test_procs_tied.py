"""A demo killed with SIGKILL left every stage it started running (no one sent them a
signal). Processes a tied :class:`Stack` starts now stop when it dies, however it dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from postbacks.tools.procs import http_json, wait_for

PARENT = textwrap.dedent("""
    import sys, tempfile, time
    from pathlib import Path
    from postbacks.tools.procs import Stack, free_port
    stack = Stack({}, Path(tempfile.mkdtemp()), tied=sys.argv[1] == "tied")
    port = free_port()
    proc = stack.start("receiver", "receiver", "--port", str(port))
    print(proc.pid, port, flush=True)
    time.sleep(120)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except FileNotFoundError:
        return False


def _child_after_parent_killed(mode: str, wait_s: float) -> tuple[int, bool]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    child, port = map(int, parent.stdout.readline().split())
    # the child is up and past its start (it answers)
    wait_for(lambda: http_json(f"http://127.0.0.1:{port}/_control/stats"), 30,
             what="the child receiver")
    assert _alive(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait(10)
    deadline = time.monotonic() + wait_s
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    return child, _alive(child)


def test_a_tied_stack_stops_with_its_parent() -> None:
    _, alive = _child_after_parent_killed("tied", 15)
    assert not alive


def test_an_untied_stack_outlives_its_parent() -> None:
    """The control: without the tie the child stays (what the test above would catch)."""
    child, alive = _child_after_parent_killed("untied", 3)
    try:
        assert alive
    finally:
        if alive:
            os.kill(child, signal.SIGTERM)


def test_a_listener_whose_port_was_taken_meanwhile_starts_on_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A free port picked for the console or the receiver can be bound by another process
    (a stage's metrics server on port 0) before it binds it: it exited ("address already
    in use") and the demo or the test waited for it in vain. It is started again on
    another port."""
    import socket

    from postbacks.tools import procs

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1], procs.free_port()])
        monkeypatch.setattr(procs, "free_port", lambda: next(ports))
        with procs.Stack({}, tmp_path) as stack:
            proc, port = stack.start_listening(
                "receiver", "receiver", "--port", "{port}",
                ready=lambda p: procs.http_json(f"http://127.0.0.1:{p}/_control/stats"))
            assert port != taken.getsockname()[1] and proc.alive()
            assert "address already in use" in (tmp_path / "receiver.log").read_text()
