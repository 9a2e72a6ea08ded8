"""Issue 39's rate-limit acceptance, as the fleet runs it: TWO worker processes (``python -m
tests.limits_child``, fleet ``Worker``s on one PostgreSQL store) run agent dispatches whose
model calls share one ``RateLimit`` against a loopback OpenAI-compatible server. Every fact
comes from the server's own request log (arrival times, which worker sent each request)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.chat_server import ChatServer
from tests.postgres_support import Databases
from tests.provider_server import Reply
from wakeful import open_store
from wakeful.fleet import submit

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent

RPM = 300.0
"""Five requests a second for the fleet."""
BURST = 0.4
"""The bucket holds two requests: the first burst, and room for a late waker."""
WINDOW = 12.0
"""Seconds of traffic counted; at ``RPM`` the budget is 60 requests."""
BURST_SPAN = 1.0
"""Requests arriving this soon after the first make the first burst, refused: the bucket's
two granted together, and any granted before the first 429's block reached the store (the
next grant is 0.2 s later; on a loaded machine the 429's round trip and the block can take
longer). Each refusal blocks the key for 2 s from its own answer."""


class FleetServer(ChatServer):
    """Answers ``429`` with ``Retry-After: 2`` to the first burst and ``ok`` after; logs
    each request's arrival (``time.monotonic``), its worker (the first path segment) and
    whether it was refused."""

    def __init__(self) -> None:
        super().__init__(answer="ok")
        self.log: list[tuple[float, str, bool]] = []
        self._first: float | None = None
        self._mine = threading.local()

    def _record(self, path: str, headers: dict[str, str], raw: bytes) -> None:
        now = time.monotonic()
        with self._lock:
            if self._first is None:
                self._first = now
            refused = now - self._first < BURST_SPAN
            self.log.append((now, path.split("/")[1], refused))
        self._mine.refused = refused
        super()._record(path, headers, raw)

    def _next(self) -> Reply:
        if self._mine.refused:
            return Reply(
                status=429,
                headers=[("Retry-After", "2")],
                body=b'{"error": {"type": "rate_limit_error", "message": "slow down"}}',
            )
        return super()._next()


def _spawn(url: str, worker_id: str, base_url: str, directory: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "tests.limits_child", url, worker_id, base_url, str(RPM)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    return subprocess.Popen([*argv, str(BURST)], cwd=directory, env=env, stderr=subprocess.PIPE)


@pytest.mark.asyncio
async def test_two_workers_back_off_together_after_a_429_and_hold_the_rate(
    pg_databases: Databases, tmp_path: Path
) -> None:
    """The issue asks for 120 requests a minute over 60 s, 120 +- 5 %. A minute of traffic
    stays in ``benchmarks/flow_control`` (122 and 124 measured there, with its one second of
    burst); here the same bound is checked on a scaled run that costs 12 s of traffic:
    ``RPM`` = 300 over ``WINDOW`` = 12 s is a budget of 60 requests, and +-5 % of it is
    57-63. The window starts at the first answered request, after the block: the bucket
    refills from empty then, so at most its two requests and 60 more fit in it (+3.3 %),
    and a fleet that stopped sending for a moment, or sent past the limit, falls outside
    the bound."""
    dsn = await pg_databases.clone()
    async with await open_store(dsn) as store:
        for i in range(100):  # more than the window can take: the workers never run dry
            await submit(store, f"t-{i}", "chat", "hi", dispatch_id=f"d-{i}")
    with FleetServer() as server:
        workers = [_spawn(dsn, name, f"{server.url}/{name}/v1", tmp_path) for name in ("w1", "w2")]
        try:
            deadline = time.monotonic() + 60
            while not all((tmp_path / f"{n}.up").exists() for n in ("w1", "w2")):
                assert time.monotonic() < deadline, "the workers did not start"
                assert all(w.poll() is None for w in workers), "a worker exited"
                await asyncio.sleep(0.05)
            while not any(not refused for _, _, refused in server.log):
                assert time.monotonic() < deadline, f"no request answered: {server.log}"
                await asyncio.sleep(0.05)
            first_ok = min(t for t, _, refused in server.log if not refused)
            await asyncio.sleep(max(0.0, first_ok + WINDOW + 0.5 - time.monotonic()))
            assert all(w.poll() is None for w in workers), "a worker exited"
        finally:
            for w in workers:
                if w.poll() is None:
                    os.kill(w.pid, signal.SIGKILL)
                w.communicate(timeout=30)
    log = sorted(server.log)
    refused = [t for t, _, r in log if r]
    answered = [(t, worker) for t, worker, r in log if not r]
    first_refused = refused[0]
    assert refused and refused[-1] - first_refused < BURST_SPAN, log[:5]
    # after the 429s, no request from either worker until their Retry-After had passed
    gap = answered[0][0] - refused[-1]
    assert gap >= 1.95, f"a request {gap:.3f} s after the last 429"
    # the rate: 60 +- 5 % in the window, and both workers took part
    counted = [worker for t, worker in answered if t - first_ok < WINDOW]
    assert 57 <= len(counted) <= 63, f"{len(counted)} requests in {WINDOW:g} s (budget 60)"
    assert {"w1", "w2"} <= set(counted), f"one worker sent everything: {set(counted)}"
