"""Starting and stopping the pipeline's processes (demo, tests, benchmarks)."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

__all__ = ["Proc", "Stack", "follow_parent", "free_port", "http_json", "metrics_page", "wait_for"]

PARENT_ENV = "POSTBACKS_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def follow_parent() -> None:
    """Stop this process when the process that started it dies, if it was asked to.

    A :class:`Stack` started with ``tied=True`` names its own PID in ``POSTBACKS_PARENT_PID``.
    The kernel then sends this process SIGTERM when that parent dies, however it dies
    (a SIGKILLed demo leaves no stage running). Linux only; elsewhere a no-op.
    """
    want = os.environ.pop(PARENT_ENV, "")
    if not want or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if str(os.getppid()) != want:  # the parent died before the line above
        os.kill(os.getpid(), signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_json(url: str, payload: Any = None, timeout: float = 10.0) -> Any:
    data = None if payload is None else orjson.dumps(payload)
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return orjson.loads(resp.read())


def wait_for(predicate: Any, timeout: float, interval: float = 0.2, what: str = "condition",
             progress: Any = None) -> Any:
    """``predicate()`` once truthy (its value), polled every ``interval``; TimeoutError after
    ``timeout`` naming ``what`` and, given ``progress``, what it returns at that moment."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # the thing waited for may not be up yet
            last_exc = exc
        time.sleep(interval)
    now = ""
    if progress is not None:
        try:
            now = f"; now {progress()}"
        except Exception as exc:  # the thing measured may be gone too
            now = f"; now unknown ({exc!r})"
    raise TimeoutError(
        f"timed out after {timeout:.0f}s waiting for {what}{now} (last error: {last_exc})"
    )


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill9(self) -> None:
        if self.alive():
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def stop(self, timeout: float = 20.0) -> int | None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        self.log_file.close()
        return self.popen.returncode

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def metrics(self, timeout: float = 5.0) -> str | None:
        """The process's whole /metrics page (its address from its log: "metrics on
        <url>"), or None when the log names none yet. OSError when it does not answer."""
        return metrics_page(self.log_path, timeout)


def metrics_page(log_path: Path, timeout: float = 5.0) -> str | None:
    """A stage's /metrics page, its address read from its log (see :meth:`Proc.metrics`)."""
    import re

    urls = re.findall(r"metrics on (http://\S+)", log_path.read_text(errors="replace"))
    if not urls:
        return None
    with urllib.request.urlopen(urls[-1], timeout=timeout) as r:
        return str(r.read().decode())


@dataclass
class Stack:
    """A set of pipeline processes sharing one environment; stops them all on exit."""

    env: Mapping[str, str]
    log_dir: Path
    procs: dict[str, Proc] = field(default_factory=dict)
    tied: bool = False
    """Each process stops when this one dies (see :func:`follow_parent`). Start tied
    processes from the main thread: the kernel watches the thread that started them."""

    def start(self, name: str, *args: str, extra_env: Mapping[str, str] | None = None) -> Proc:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        log_file = log_path.open("ab")
        env = {**os.environ, **self.env, **(extra_env or {})}
        if self.tied:
            env[PARENT_ENV] = str(os.getpid())
        popen = subprocess.Popen(
            [sys.executable, "-m", "postbacks", *args], env=env, stdout=log_file,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        proc = Proc(name, popen, log_path, log_file)
        self.procs[name] = proc
        return proc

    def start_listening(self, name: str, *args: str, ready: Callable[[int], Any],
                        timeout: float = 30.0, tries: int = 3) -> tuple[Proc, int]:
        """Start a process that listens on a port picked here (``{port}`` in ``args``) and
        wait until ``ready(port)``. A free port can be taken by another process before this
        one binds it (a stage's metrics server on port 0): it then exits with "address
        already in use", and is started again on another port."""
        for _ in range(tries):
            port = free_port()
            proc = self.start(name, *(a.replace("{port}", str(port)) for a in args))

            def up(proc: Proc = proc, port: int = port) -> str | None:
                if not proc.alive():
                    return "exited"
                return "up" if ready(port) else None

            if wait_for(up, timeout, what=f"{name} on port {port}") == "up":
                return proc, port
            if "address already in use" not in proc.tail():
                raise RuntimeError(f"{name} exited at its start:\n{proc.tail()}")
        raise RuntimeError(f"{name}: every port tried was taken before it could bind one")

    def stop_all(self) -> None:
        for proc in list(self.procs.values()):
            proc.stop()

    def dead(self) -> list[str]:
        return [n for n, p in self.procs.items() if not p.alive()]

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
