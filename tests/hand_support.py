"""Helpers for the Remote Hand tests: tools that count their effects, the hand service
in this event loop or in a child process (``tests.hand_child``), and polling."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from wakeful.fleet.hand import HandService
from wakeful.fleet.handserver import create_app

ROOT = Path(__file__).resolve().parent.parent
DEADLINE = 20.0


class Effects:
    """Tools whose every execution is appended to a file (the effect being counted)."""

    def __init__(self, workdir: Path) -> None:
        self.path = workdir / "executions"
        self.path.touch()
        self.gate = asyncio.Event()

    def lines(self) -> list[str]:
        return self.path.read_text(encoding="utf-8").splitlines()

    def record(self, tag: str) -> int:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(tag + "\n")
        return len(self.lines())

    def tools(self) -> dict[str, Callable[..., Any]]:
        def count(tag: str, amount: int = 1) -> dict[str, Any]:
            return {"tag": tag, "amount": amount, "executions": self.record(tag)}

        def fail(tag: str) -> None:
            self.record(tag)
            raise RuntimeError(f"card declined for {tag}")

        async def gated(tag: str) -> str:
            self.record(tag)
            await self.gate.wait()
            return f"finished {tag}"

        return {"count": count, "fail": fail, "gated": gated}


@asynccontextmanager
async def running_hand(
    ledger: Path, effects: Effects, **app_options: Any
) -> AsyncIterator[tuple[str, HandService]]:
    """The hand service on an ephemeral port of 127.0.0.1, in this event loop
    (``app_options`` go to ``create_app``: tokens, allowed hosts)."""
    service = HandService(ledger, effects.tools())
    config = uvicorn.Config(
        create_app(service, **app_options),
        host="127.0.0.1",
        port=0,
        log_config=None,
        log_level="warning",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        deadline = time.monotonic() + DEADLINE
        while not server.started:
            if serving.done():
                await serving
                pytest.fail("uvicorn stopped before it started")
            if time.monotonic() > deadline:
                pytest.fail("uvicorn did not start in time")
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}", service
    finally:
        server.should_exit = True
        effects.gate.set()
        await serving
        await service.aclose()


async def until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


class HandChild:
    """``tests.hand_child`` in a child process, on ``port`` (0: an ephemeral one)."""

    def __init__(self, ledger: Path, workdir: Path, name: str, port: int = 0) -> None:
        self.portfile = workdir / f"port-{name}"
        self.stderr_path = workdir / f"stderr-{name}"
        self.stderr = open(self.stderr_path, "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.hand_child",
                str(ledger),
                str(workdir),
                str(self.portfile),
                str(port),
            ],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
        )

    async def url(self) -> str:
        await until(
            lambda: self.portfile.exists() or self.process.poll() is not None, "the child's port"
        )
        assert self.process.poll() is None, self.output()
        return f"http://127.0.0.1:{self.portfile.read_text(encoding='utf-8')}"

    def output(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def stop(self, sig: int) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        code = self.process.wait(timeout=DEADLINE)
        self.stderr.close()
        return code
