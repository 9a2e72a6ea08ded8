"""The ``wakeful`` command line through its real entry point: human and ``--json`` output
and exit codes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli_support import ROOT, WAKEFUL, cli, free_port
from wakeful import open_store
from wakeful.fleet import submit


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'cli.db'}"

    async def prepare() -> None:
        async with open_store(url) as s:
            await submit(s, "t-1", "greeter", "hi", dispatch_id="d-1")
            await submit(s, "t-2", "greeter", "hi", dispatch_id="d-2", max_attempts=1)
            [lease] = await s.claim_next("someone", 0.001)
            assert lease.dispatch.dispatch_id == "d-1"
            await s.register_worker("w-1")

    asyncio.run(prepare())
    return url


def test_help_and_version() -> None:
    done = cli("--help")
    assert done.returncode == 0 and "threads" in done.stdout and "quarantine" in done.stdout
    assert cli("--version").returncode == 0
    # --help and docs/cli.md list the same exit codes, the docs in one table
    listed = re.search(r"Exit codes: (.*?)\.\n\n", done.stdout, re.S)
    assert listed is not None
    assert re.findall(r"(\d)\s+[a-z]", listed[1]) == [str(code) for code in range(8)]
    docs = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    section = docs.split("## Exit codes\n\n", 1)[1].split("\n\n", 1)[0]
    assert re.findall(r"^\| (\d) \|", section, re.M) == [str(code) for code in range(8)]
    assert "`wakeful quarantine purge ID [--yes]`" in docs


def test_run_streams_the_answer_and_reports_completion(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'run.db'}"
    done = cli("run", "t-1", "greeter", "hello", "--app", "tests.cli_app:registry", store=url)
    assert done.returncode == 0, done.stderr
    assert "Hello from the command line." in done.stdout and "completed" in done.stdout
    again = cli(
        "run", "t-2", "greeter", "hello", "--app", "tests.cli_app:registry", "--json", store=url
    )
    result = json.loads(again.stdout.strip().splitlines()[-1])
    assert result["status"] == "completed" and result["event"] == "run.completed"
    listed = json.loads(cli("threads", "list", "--json", store=url).stdout)
    assert [t["thread_id"] for t in listed] == ["t-1", "t-2"]
    shown = json.loads(cli("threads", "show", "t-1", "--json", store=url).stdout)
    assert shown["checkpoint"]["status"] == "completed"
    events = json.loads(cli("threads", "events", "t-1", "--json", store=url).stdout)
    assert events[0]["type"] == "run.started" and events[-1]["type"] == "run.completed"
    human = cli("threads", "events", "t-1", store=url)
    assert human.returncode == 0 and "run.completed" in human.stdout


def test_dispatch_and_worker_listings(store: str) -> None:
    rows = json.loads(cli("dispatches", "list", "--json", store=store).stdout)
    assert {d["dispatch_id"]: d["status"] for d in rows} == {"d-1": "leased", "d-2": "pending"}
    pending = json.loads(
        cli("dispatches", "list", "--status", "pending", "--json", store=store).stdout
    )
    assert [d["dispatch_id"] for d in pending] == ["d-2"]
    human = cli("dispatches", "list", store=store)
    assert human.returncode == 0 and "d-1" in human.stdout and "leased" in human.stdout
    shown = json.loads(cli("dispatches", "show", "d-2", "--json", store=store).stdout)
    assert shown["thread_id"] == "t-2" and shown["max_attempts"] == 1
    workers = json.loads(cli("workers", "list", "--json", store=store).stdout)
    assert [w["worker_id"] for w in workers] == ["w-1"]
    assert "w-1" in cli("workers", "list", store=store).stdout


def test_exit_codes(store: str) -> None:
    missing = cli("dispatches", "show", "d-missing", store=store)
    assert missing.returncode == 3 and "does not exist" in missing.stderr
    assert cli("threads", "show", "t-missing", store=store).returncode == 3
    refused = cli("quarantine", "add", "d-2", store=store)
    assert refused.returncode == 4 and "exhausted" in refused.stderr
    assert cli("threads", "list", store="redis://nope").returncode == 6
    assert cli("dispatches", "list", "--status", "bogus", store=store).returncode == 2


def test_quarantine_lifecycle(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"

    async def exhaust() -> None:
        async with open_store(url) as s:
            await submit(s, "t-q", "greeter", "hi", dispatch_id="d-q", max_attempts=1)
            await s.claim_next("crashed-worker", 0.001)

    asyncio.run(exhaust())
    deadline = time.monotonic() + 10
    while True:  # the lease above lasts 1 ms of wall-clock time
        done = cli("quarantine", "add", "d-q", store=url)
        if done.returncode == 0 or time.monotonic() > deadline:
            break
    assert (done.returncode, done.stdout) == (0, "quarantined d-q (thread t-q)\n"), done.stderr
    shown = json.loads(cli("quarantine", "show", "d-q", "--json", store=url).stdout)
    assert shown["status"] == "quarantined"
    listed = json.loads(cli("quarantine", "list", "--json", store=url).stdout)
    assert [d["dispatch_id"] for d in listed] == ["d-q"]
    assert "d-q" in cli("quarantine", "show", "d-q", store=url).stdout
    assert cli("quarantine", "requeue", "d-q", store=url).stdout == "requeued d-q (thread t-q)\n"
    requeued = json.loads(cli("dispatches", "show", "d-q", "--json", store=url).stdout)
    assert requeued["status"] == "pending" and requeued["attempts"] == 0
    assert cli("quarantine", "purge", "d-q", "--yes", store=url).returncode == 4, (
        "pending work is not purged"
    )


def test_worker_runs_work_and_stops_on_sigterm(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'w.db'}"

    async def enqueue() -> None:
        async with open_store(url) as s:
            await submit(s, "t-w", "greeter", "hi", dispatch_id="d-w")

    asyncio.run(enqueue())
    env = {
        **os.environ,
        "WAKEFUL_STORE": url,
        "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT))),
    }
    proc = subprocess.Popen(
        [WAKEFUL, "worker", "--app", "tests.cli_app:registry", "--poll", "0.1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            shown = cli("dispatches", "show", "d-w", "--json", store=url)
            if shown.returncode == 0 and json.loads(shown.stdout)["status"] == "done":
                break
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "stopped" in out


def test_migrate_and_demo(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    done = cli("migrate", store=url)
    assert done.returncode == 0 and "migrated" in done.stdout
    claims = cli("demo", "--claims")
    assert claims.returncode == 0 and "refused" in claims.stdout


def serve_until_healthy(args: list[str], port: int, path: str, env_store: str | None) -> str:
    """Start a long-running CLI command, wait until it answers ``path``, SIGTERM it; returns
    the body it answered."""
    import httpx

    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT)))}
    if env_store is not None:
        env["WAKEFUL_STORE"] = env_store
    proc = subprocess.Popen(
        [WAKEFUL, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=2)
                if answer.status_code == 200:
                    return answer.text
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"{args[0]} never answered {path}"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
        assert proc.returncode == 0


def test_serve_answers_until_sigterm(tmp_path: Path) -> None:
    port = free_port()
    url = f"sqlite:///{tmp_path / 's.db'}"
    body = serve_until_healthy(["serve", "--port", str(port)], port, "/readyz", url)
    assert "ok" in body or "ready" in body


def test_hand_serve_answers_until_sigterm(tmp_path: Path) -> None:
    port = free_port()
    args = [
        "hand",
        "serve",
        "--ledger",
        str(tmp_path / "hand.db"),
        "--tools",
        "tests.cli_app:hand_tools",
        "--port",
        str(port),
    ]
    serve_until_healthy(args, port, "/healthz", None)


def test_relay_stops_on_sigterm(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    env = {
        **os.environ,
        "WAKEFUL_STORE": url,
        "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT))),
    }
    proc = subprocess.Popen(
        [WAKEFUL, "relay"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # the relay claims the well-known relay thread once it runs
            shown = cli("threads", "show", "wakeful.relay", "--json", store=url)
            if shown.returncode == 0 and json.loads(shown.stdout)["claim"] is not None:
                break
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "relay stopped" in out


@pytest.mark.slow
def test_the_full_demo_through_the_cli() -> None:
    done = cli("demo")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAIL" not in done.stdout and "the stream continued from its checkpoint" in done.stdout
