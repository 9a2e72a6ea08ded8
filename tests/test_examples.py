"""The three applications in ``examples/`` run as their README says, against a local
OpenAI-compatible server (``OPENAI_BASE_URL``), as real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

from tests.chat_server import ChatServer
from tests.cli_support import ROOT, WAKEFUL, free_port


def example_env(model: ChatServer, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "OPENAI_BASE_URL": model.base_url,
        "OPENAI_API_KEY": "sk-local-test",
        "WAKEFUL_MODEL": "local-test-model",
        "PYTHONPATH": str(ROOT),
        **extra,
    }
    env.pop("WAKEFUL_LOG_LEVEL", None)
    return env


def run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


@contextmanager
def process(args: list[str], env: dict[str, str], cwd: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        args, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err


def test_support_desk_fleet_driven_over_http(tmp_path: Path) -> None:
    port = free_port()
    ledger = tmp_path / "refunds.jsonl"
    app = "examples.support_desk.app:registry"
    tools = {"lookup_order": {"order_id": 42}, "refund": {"order_id": 42}}
    with ChatServer(tools) as model, ExitStack() as fleet:
        env = example_env(model, SUPPORT_LEDGER=str(ledger), WAKEFUL_STORE="sqlite:///desk.db")
        fleet.enter_context(
            process([WAKEFUL, "serve", "--app", app, "--port", str(port)], env, tmp_path)
        )
        for name in ("desk-1", "desk-2"):
            worker = [WAKEFUL, "worker", "--app", app, "--worker-id", name, "--poll", "0.1"]
            fleet.enter_context(process(worker, env, tmp_path))
        api = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{api}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the API never became ready"
            time.sleep(0.05)
        driven = run(
            [sys.executable, "-m", "examples.support_desk.drive", "--api", api, "--timeout", "60"],
            env,
            ROOT,
        )
    assert driven.returncode == 0, driven.stdout + driven.stderr
    assert "approval asked: refund({'order_id': 42})" in driven.stdout
    assert "completed" in driven.stdout.splitlines()[-1]
    refunds = [json.loads(line) for line in ledger.read_text(encoding="utf-8").splitlines()]
    assert [(r["order_id"], r["cents"]) for r in refunds] == [(42, 24900)]


def test_research_graph_fans_out_and_waits_for_approval(tmp_path: Path) -> None:
    questions = "What is a heat pump?\nHow cold is too cold?\nWhat does it cost?"
    with ChatServer(answer=questions) as model:
        done = run(
            [sys.executable, "-m", "examples.research", "--answer", "yes", "Heat pumps"],
            example_env(model),
            tmp_path,
        )
        asked = len(model.received)
    assert done.returncode == 0, done.stderr
    assert "Publish this report? (3 findings)" in done.stdout
    assert done.stdout.count("* ") == 3 and "completed" in done.stdout
    assert asked == 1 + 3 + 1  # the plan, one request per question, the report


def test_two_services_exchange_messages_through_the_relay(tmp_path: Path) -> None:
    with ChatServer(answer="Thank you for your order!") as model:
        done = run(
            [sys.executable, "-m", "examples.messaging", "--orders", "3", "--timeout", "60"],
            example_env(model),
            tmp_path,
        )
        notes = len(model.received)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 of 3 orders paid" in done.stdout
    assert "INV-00002" in done.stdout and "Thank you for your order!" in done.stdout
    assert notes == 3  # one invoice note per order: no message was delivered twice
