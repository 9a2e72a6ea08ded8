"""The console's end-to-end rig: ``wakeful serve`` and ``wakeful worker`` as real
subprocesses over one SQLite file, the local model server, and Debian's Chromium driven by
Playwright (its own browser download cannot work here: ``executable_path``)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.chat_server import ChatServer
from tests.cli_support import ROOT, WAKEFUL, cli_env, free_port
from wakeful import open_store

CHROMIUM = os.environ.get("WAKEFUL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
APP = "tests.console_app:registry"
ALPHA = "alpha-token-0001"
BETA = "beta-token-00001"
OPERATOR = "operator-token-01"
TOKENS = {ALPHA: "alpha", BETA: "beta", OPERATOR: "*"}
SHOTS = (
    ROOT / "docs" / "console"
    if os.environ.get("WAKEFUL_SCREENSHOTS") == "docs"
    else Path(tempfile.gettempdir()) / "wakeful-console-shots"
)
"""Where the e2e tests photograph each view: docs/console/ when ``WAKEFUL_SCREENSHOTS=docs``
(to refresh the set docs/console.md shows), else a temporary folder, so a test run leaves
the checkout as it was."""
DEADLINE = 30.0


def chromium_or_skip() -> str:
    """Debian's Chromium (``.ci/run`` installs it); without it the e2e tests fail when
    services are required and skip otherwise."""
    if shutil.which(CHROMIUM) is None:
        if os.environ.get("WAKEFUL_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
        pytest.skip(f"{CHROMIUM} is missing")
    return CHROMIUM


@dataclass
class Fleet:
    """A server and workers over ``store``; workers are started and SIGKILLed by the test."""

    tmp: Path
    model: ChatServer
    store: str
    port: int
    server: subprocess.Popen[bytes] | None = None
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return cli_env(self.store, CONSOLE_MODEL_URL=self.model.base_url)

    def serve(self) -> None:
        tokens = self.tmp / "tokens.json"
        tokens.write_text(json.dumps(TOKENS))
        log = self.tmp / "serve.log"
        with log.open("w") as out:
            self.server = subprocess.Popen(
                [WAKEFUL, "serve", "--app", APP, "--port", str(self.port), "--tokens",
                 str(tokens)],
                cwd=ROOT, env=self.env(), stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + DEADLINE
        while True:
            assert self.server.poll() is None, log.read_text()
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "wakeful serve did not start"
            time.sleep(0.05)

    def worker(self, worker_id: str, *more: str) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"worker-{worker_id}.log").open("ab")
        proc = subprocess.Popen(
            [WAKEFUL, "worker", "--app", APP, "--worker-id", worker_id, "--ttl", "2",
             "--poll", "0.1", "--concurrency", "4", *more],
            cwd=ROOT, env=self.env(), stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
        log.close()  # the child holds its own descriptor; the file is there to read after a failure
        self.workers.append(proc)
        return proc

    def api(self, token: str = OPERATOR) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=DEADLINE
        )

    def close(self) -> None:
        for proc in [*self.workers, self.server]:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=DEADLINE)


@contextmanager
def fleet(tmp: Path) -> Iterator[Fleet]:
    with ChatServer() as model:
        made = Fleet(tmp, model, f"sqlite:///{tmp / 'console.db'}", free_port())
        try:
            made.serve()
            yield made
        finally:
            made.close()


def wait_until(check: Any, what: str, timeout: float = DEADLINE) -> Any:
    """Poll ``check()`` until it returns something truthy (a deadline, not a hope)."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def with_store(rig: Fleet, action: Callable[[Any], Awaitable[Any]]) -> Any:
    """``await action(store)`` on the rig's store, opened for the call. In a thread: the
    Playwright sync API runs an event loop in the test's own thread."""

    async def run() -> Any:
        async with open_store(rig.store) as store:
            return await action(store)

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result()
