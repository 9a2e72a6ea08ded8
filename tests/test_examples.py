"""The three applications in ``examples/`` run as their README says, against a local
OpenAI-compatible server (``OPENAI_BASE_URL``), as real processes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests.chat_server import ChatServer
from tests.cli_support import ROOT, WAKEFUL, free_port
from wakeful import open_store

EXAMPLES_README = ROOT / "examples" / "README.md"


def example_env(model: ChatServer, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "COLUMNS": "200",
        "OPENAI_BASE_URL": model.base_url,
        "OPENAI_API_KEY": "sk-local-test",
        "WAKEFUL_MODEL": "local-test-model",
        "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT))),
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
        # at once, as the README's block does: drive waits for the API to be ready
        driven = run(
            [sys.executable, "-m", "examples.support_desk.drive", "--api", api, "--timeout", "60"],
            env,
            ROOT,
        )
    assert driven.returncode == 0, driven.stdout + driven.stderr
    assert "approval asked: refund({'order_id': 42})" in driven.stdout
    assert "completed" in driven.stdout.splitlines()[-1]
    turns = [line for line in driven.stdout.splitlines() if line.startswith("assistant:")]
    assert turns[:2] == [
        'assistant: calls lookup_order({"order_id": 42})',
        'assistant: calls refund({"order_id": 42})',
    ], driven.stdout
    assert all(line.removeprefix("assistant:").strip() for line in turns), driven.stdout
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


def documented(marker: str) -> list[list[str]]:
    """The commands of the ``sh`` block of examples/README.md that contains ``marker``, one
    per line, split as a shell would (comments dropped)."""
    text = EXAMPLES_README.read_text(encoding="utf-8")
    [block] = [b for b in re.findall(r"```sh\n(.*?)```", text, flags=re.S) if marker in b]
    return [words for line in block.splitlines() if (words := shlex.split(line, comments=True))]


def program(words: list[str]) -> list[str]:
    """``words`` with ``wakeful`` and ``python`` as installed in this test's environment."""
    exe = {"wakeful": WAKEFUL, "python": sys.executable}
    return [exe.get(words[0], words[0]), *words[1:]]


def thread_status(env: dict[str, str], cwd: Path, thread: str) -> str | None:
    async def read() -> str | None:
        async with open_store(env["WAKEFUL_STORE"]) as store:
            snap = await store.read(thread)
            return snap.checkpoint.status if snap and snap.checkpoint else None

    here = os.getcwd()
    os.chdir(cwd)  # the store URL is relative to where the commands ran
    try:
        return asyncio.run(read())
    finally:
        os.chdir(here)


def test_research_runs_step_by_step_with_the_cli_as_documented(tmp_path: Path) -> None:
    """The README's CLI sequence, verbatim: run to the interrupt, resume, a worker (stopped
    with Ctrl-C once the run completed) continues it, the events show it ended."""
    questions = "What is a heat pump?\nHow cold is too cold?\nWhat does it cost?"
    outputs: dict[str, subprocess.CompletedProcess[str]] = {}
    with ChatServer(answer=questions) as model:
        env = example_env(model)
        for words in documented("wakeful resume r-1"):
            if words[0] == "export":
                name, _, value = words[1].partition("=")
                env[name] = value
            elif words[:2] == ["wakeful", "worker"]:
                worker = subprocess.Popen(
                    program(words), env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True,
                )  # fmt: skip
                deadline = time.monotonic() + 60
                while thread_status(env, tmp_path, "r-1") != "completed":
                    assert worker.poll() is None, worker.communicate()[1]
                    assert time.monotonic() < deadline, "the worker did not finish the run"
                    time.sleep(0.1)
                worker.send_signal(signal.SIGINT)  # Ctrl-C, as the README says
                out, err = worker.communicate(timeout=30)
                assert worker.returncode == 0, err
                outputs["worker"] = subprocess.CompletedProcess(words, 0, out, err)
            else:
                done = run(program(words), env, tmp_path)
                assert done.returncode == 0, f"{shlex.join(words)}\n{done.stdout}{done.stderr}"
                outputs[" ".join(words[:2])] = done
        asked = len(model.received)
    assert "waiting for answers to s2-t0-i1" in outputs["wakeful run"].stdout
    assert re.search(r"ended done in .* s: run run-d-\S+ completed", outputs["worker"].stderr)
    events = outputs["wakeful threads"].stdout
    assert "run.suspended" in events and "run.resumed" in events
    assert events.rstrip().splitlines()[-2].split("│")[3].strip() == "run.completed", events
    assert asked == 1 + 3 + 1  # the plan, one request per question, the report


def test_the_messaging_commands_read_the_store_the_example_wrote(tmp_path: Path) -> None:
    """The README's two commands, verbatim: the follow-up reads the example's store and
    shows the message events it promises."""
    with ChatServer(answer="Thank you for your order!") as model:
        env = example_env(model)
        results = []
        for words in documented("examples.messaging"):
            if words[0] == "export":
                name, _, value = words[1].partition("=")
                env[name] = value
                continue
            done = run(program(words), env, tmp_path)
            assert done.returncode == 0, f"{shlex.join(words)}\n{done.stdout}{done.stderr}"
            results.append(done)
    assert [r.args[1:3] for r in results] == [["-m", "examples.messaging"], ["threads", "events"]]
    assert "3 of 3 orders paid" in results[0].stdout
    assert (tmp_path / "messaging.db").exists()
    assert not (tmp_path / "wakeful.db").exists(), "a command used another store"
    types = [row.split("│")[3].strip() for row in results[1].stdout.splitlines() if "│" in row]
    assert types == [
        "run.started", "message.sent", "task.completed", "run.completed",
        "run.started", "message.received", "task.completed", "run.completed",
    ], results[1].stdout  # fmt: skip
