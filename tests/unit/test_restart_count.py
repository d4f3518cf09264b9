"""A restart in place (exec, same PID) is counted: the copy's
``postbacks_restarts_in_place_total`` goes on from the one before (a supervisor sees no
restart, so this counter is the only sign of a stage restarting over and over)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from postbacks.kafka import watchdog


def test_the_count_goes_to_the_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    execs: list[list[str]] = []
    monkeypatch.setattr(os, "execv", lambda _exe, argv: execs.append(argv))
    monkeypatch.setattr(os, "environ", {**os.environ})
    os.environ.pop(watchdog.RESTARTS_ENV, None)
    assert watchdog.restarts_so_far() == 0
    watchdog.restart_in_place("test: first")
    watchdog.restart_in_place("test: second")
    assert len(execs) == 2 and watchdog.restarts_so_far() == 2
    os.environ[watchdog.RESTARTS_ENV] = "garbage"
    assert watchdog.restarts_so_far() == 0


def test_a_copy_exports_the_count() -> None:
    """In a fresh interpreter, as a stage's copy starts: set up, then read /metrics'
    registry."""
    code = textwrap.dedent("""
        from prometheus_client import REGISTRY
        from postbacks.runtime import setup_process
        from postbacks.settings import load_settings
        import dataclasses
        setup_process("agent", dataclasses.replace(load_settings(), metrics_port=0))
        print(REGISTRY.get_sample_value("postbacks_restarts_in_place_total"))
    """)
    for env, want in (("3", "3.0"), (None, "0.0")):
        environ = {k: v for k, v in os.environ.items() if k != watchdog.RESTARTS_ENV}
        if env is not None:
            environ[watchdog.RESTARTS_ENV] = env
        done = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().splitlines()[-1] == want, done.stdout
