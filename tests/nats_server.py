"""A private ``nats-server`` process for tests that freeze, kill or restart NATS.

The shared server on 4222 is never touched: each ``PrivateNats`` runs its own binary on a
free loopback port with its own store directory, and can be frozen (SIGSTOP), thawed
(SIGCONT), killed (SIGKILL) and started again on the same port."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services import services_required

BINARY = os.environ.get("WAKEFUL_TEST_NATS_SERVER", "/usr/sbin/nats-server")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def nats_server_binary() -> str:
    """The nats-server binary; skips loudly (fails under WAKEFUL_REQUIRE_SERVICES=1)
    without one."""
    found = shutil.which(BINARY)
    if found is None:
        message = f"!!! no nats-server binary at {BINARY}: the tests that freeze NATS are NOT run"
        if services_required():
            pytest.fail(message + " WAKEFUL_REQUIRE_SERVICES=1 makes this a failure.")
        pytest.skip(message)
    return found


def stopped(pid: int) -> bool:
    """Every thread of process ``pid`` is stopped (state ``T`` in /proc)."""
    states = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        with contextlib.suppress(OSError):
            states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
    return bool(states) and all(state in ("T", "t") for state in states)


class PrivateNats:
    """One nats-server on ``127.0.0.1:port`` (a free one by default)."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.binary = nats_server_binary()
        self.directory = directory
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, deadline: float = 15.0) -> None:
        """Start the server and wait until it accepts connections."""
        store = self.directory / "nats-store"
        store.mkdir(parents=True, exist_ok=True)
        log = (self.directory / "nats-server.log").open("ab")
        with log:
            self.proc = subprocess.Popen(
                [self.binary, "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(store)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.proc.returncode}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as conn,
            ):
                conn.settimeout(2)
                if conn.recv(4).startswith(b"INFO"):
                    return
            time.sleep(0.05)
        raise RuntimeError(f"nats-server did not start on port {self.port}")

    def _signal(self, sig: int) -> None:
        assert self.proc is not None and self.proc.poll() is None
        os.kill(self.proc.pid, sig)

    def freeze(self, deadline: float = 5.0) -> None:
        """SIGSTOP, returning once every thread of the server is stopped (a signal is
        delivered asynchronously: a thread running on another core goes on for a moment)."""
        self._signal(signal.SIGSTOP)
        assert self.proc is not None
        end = time.monotonic() + deadline
        while not stopped(self.proc.pid):
            if time.monotonic() > end:
                raise RuntimeError("nats-server did not stop on SIGSTOP")
            time.sleep(0.005)

    def thaw(self) -> None:
        self._signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL (a frozen server too) and reap."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(15)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@contextlib.contextmanager
def private_nats(directory: Path) -> Iterator[PrivateNats]:
    server = PrivateNats(directory)
    server.start()
    try:
        yield server
    finally:
        server.stop()


__all__ = ["PrivateNats", "free_port", "nats_server_binary", "private_nats", "stopped"]
