"""The ``wakeful`` commands through the real entry point: running graphs, workflow
management, listings, and every failure as one ``error:`` line with its exit code."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.cli_app import registry
from tests.cli_support import ROOT, WAKEFUL, cli, cli_env, error_line, free_port
from tests.services import POSTGRES_HOST, POSTGRES_PORT, POSTGRES_USER, postgres_dsn
from wakeful import ManualClock, open_store
from wakeful.fleet import LocalWake, Worker, submit

APP = "tests.cli_app:registry"


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def drain(url: str, dispatch_id: str) -> None:
    """Run an in-process worker over ``url`` until ``dispatch_id`` is settled."""

    async def go() -> None:
        async with open_store(url) as store:
            wake = LocalWake()
            w = Worker(store, registry(), concurrency=1, wake=wake, poll_interval=0.05)
            running = asyncio.create_task(w.run())
            deadline = time.monotonic() + 30
            while True:
                d = await store.get_dispatch(dispatch_id)
                assert d is not None
                if d.status in ("done", "awaiting"):
                    break
                assert time.monotonic() < deadline, d
                await asyncio.sleep(0.02)
            await w.stop(5)
            await running

    asyncio.run(go())


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# ------------------------------------------------------------------------------ run


def test_run_ends_promptly_with_one_line_when_the_target_is_refused(url: str) -> None:
    unknown = cli("run", "t-x", "nosuch", "hi", "--app", APP, store=url, timeout=30)
    assert unknown.returncode == 3
    assert "target 'nosuch' is not in" in error_line(unknown) and "greeter" in unknown.stderr
    # a refusal only the worker can see (the thread's last run is unfinished) ends run too
    asked = as_json(cli("run", "t-a", "asker", "--app", APP, "--json", store=url))
    assert asked["status"] == "suspended"
    refused = cli("run", "t-a", "tally", "--input", "{}", "--app", APP, store=url, timeout=30)
    assert refused.returncode == 4, refused.stderr
    line = error_line(refused)
    assert f"unfinished run {asked['run_id']}" in line and "suspended" in line
    assert "nothing was submitted" in line  # a suspended run keeps the thread busy (issue 36)
    events = as_json(cli("threads", "events", "t-a", "--json", store=url))
    assert events[-1]["type"] == "run.suspended"


def test_run_leaves_the_queued_work_of_other_threads_alone(url: str) -> None:
    queued = as_json(cli("submit", "t-other", "greeter", "hi", "--json", store=url))
    done = as_json(cli("run", "t-mine", "greeter", "hello", "--app", APP, "--json", store=url))
    assert done["status"] == "completed"

    async def other() -> Any:
        async with open_store(url) as store:
            return await store.get_dispatch(queued["dispatch_id"])

    d = asyncio.run(other())
    assert d is not None and d.status == "pending" and d.attempts == 0 and d.holder is None


def test_reads_never_create_a_store_and_not_found_names_the_store(url: str, tmp_path: Path) -> None:
    db, folder = tmp_path / "cli.db", tmp_path / "files"
    for args in (
        ("threads", "events", "order-1"),
        ("threads", "list"),
        ("dispatches", "show", "d-1"),
        ("quarantine", "add", "d-1"),
        ("status",),
    ):
        missing = cli(*args, store=url)
        assert missing.returncode == 3, missing.stderr
        assert f"no store at {url}: the file {db} does not exist" in error_line(missing)
    follow = cli("threads", "events", "order-1", "--follow", store=url, timeout=30)
    assert follow.returncode == 3 and f"no store at {url}" in error_line(follow)
    empty = cli("threads", "show", "t-1", store=f"file://{folder}")
    assert empty.returncode == 3 and "does not exist" in error_line(empty)
    assert not db.exists() and not folder.exists()
    folder.mkdir()
    bare = cli("workers", "list", store=f"file://{folder}")
    assert bare.returncode == 3 and "holds no file store" in error_line(bare)
    assert list(folder.iterdir()) == []
    assert cli("submit", "t-1", "greeter", "hi", store=url).returncode == 0, "a write creates it"
    unknown = cli("threads", "events", "order-1", store=url)
    assert error_line(unknown) == f"error: thread 'order-1' does not exist in {url}"
    assert unknown.returncode == 3


def test_run_takes_json_input_for_graphs(url: str, tmp_path: Path) -> None:
    inline = as_json(
        cli(
            "run",
            "t-1",
            "tally",
            "--input",
            '{"numbers": [1, 2]}',
            "--app",
            APP,
            "--json",
            store=url,
        )
    )
    assert inline["status"] == "completed" and inline["state"]["total"] == 3
    path = tmp_path / "input.json"
    path.write_text('{"numbers": [4, 5]}', encoding="utf-8")
    from_file = cli("run", "t-2", "tally", "--input-file", str(path), "--app", APP, store=url)
    assert from_file.returncode == 0 and '"total": 9' in from_file.stdout
    stdin = cli("run", "t-3", "tally", "--input-file", "-", "--app", APP, "--json", store=url,
                stdin='{"numbers": [7]}')  # fmt: skip
    assert as_json(stdin)["state"]["total"] == 7
    not_object = cli("run", "t-4", "tally", "hello", "--app", APP, store=url)
    assert not_object.returncode == 6 and "JSON object" in error_line(not_object)
    bad = cli("run", "t-4", "tally", "--input", "{nope", "--app", APP, store=url)
    assert bad.returncode == 6 and "--input is not valid JSON" in error_line(bad)
    missing = cli("run", "t-4", "tally", "--input-file", str(tmp_path / "nope"), "--app", APP,
                  store=url)  # fmt: skip
    assert missing.returncode == 6 and "cannot read --input-file" in error_line(missing)
    both = cli("run", "t-4", "tally", "hi", "--input", "{}", "--app", APP, store=url)
    assert both.returncode == 2


def test_run_recovers_streams_and_takes_single_agents_and_graphs(url: str) -> None:
    done = cli("run", "t-1", "dropper", "hi", "--app", APP, "--json", store=url)
    assert as_json(done)["status"] == "completed"  # R1 stream recovery, then completed
    support = cli("run", "t-s", "support", "hi", "--app", "tests.cli_app:support", store=url)
    assert support.returncode == 0 and "How can I help?" in support.stdout
    graph = cli("run", "t-g", "tally", "--input", "{}", "--app", "tests.cli_app:tally_graph",
                store=url)  # fmt: skip
    assert graph.returncode == 0, graph.stderr


def test_a_failed_run_exits_1_with_its_reason(url: str) -> None:
    done = cli("run", "t-b", "broken", "--input", "{}", "--app", APP, store=url)
    assert done.returncode == 1
    assert "failed: node 'work' failed" in error_line(done) and "broken on purpose" in done.stderr
    result = json.loads(cli("run", "t-b", "broken", "--input", "{}", "--app", APP, "--json",
                            store=url).stdout)  # fmt: skip
    assert result["status"] == "failed" and "broken on purpose" in result["reason"]


def test_app_must_be_a_registry_agent_graph_or_factory(url: str) -> None:
    for spec, found in (
        ("tests.cli_app:not_an_app", "is a dict"),
        ("tests.cli_app:nothing", "has no attribute 'nothing'"),
        ("no_such_module:app", "cannot import 'no_such_module'"),
        ("tests.cli_app", "not of the form module:attribute"),
    ):
        done = cli("worker", "--app", spec, store=url)
        assert done.returncode == 2 and found in error_line(done), done.stderr


# ------------------------------------------------------------------------------ errors


def test_bad_input_is_one_error_line_with_its_exit_code(url: str, tmp_path: Path) -> None:
    scheme = cli("serve", "--store", "foo://x")
    assert scheme.returncode == 6 and "unknown scheme 'foo'" in error_line(scheme)
    assert cli("threads", "list", store="redis://nope").returncode == 6
    no_file = cli("serve", "--tokens", str(tmp_path / "absent.json"), store=url)
    assert no_file.returncode == 6 and "cannot read token file" in error_line(no_file)
    malformed = tmp_path / "tokens.json"
    malformed.write_text("{nope", encoding="utf-8")
    bad = cli("serve", "--tokens", str(malformed), store=url)
    assert bad.returncode == 6 and "cannot read token file" in error_line(bad)
    assert cli("migrate", store=url).returncode == 0  # reads never create the store
    events = cli("threads", "events", "nope", store=url)
    assert events.returncode == 3 and "thread 'nope' does not exist" in error_line(events)
    for args in (("threads", "messages", "nope"), ("threads", "runs", "nope"), ("cancel", "nope")):
        assert cli(*args, store=url).returncode == 3


def test_a_port_in_use_is_one_error_line(url: str) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = cli("serve", "--port", port, store=url)
        assert done.returncode == 4 and f"cannot listen on 127.0.0.1:{port}" in error_line(done)
        hand = cli("hand", "serve", "--ledger", "/tmp/x.db", "--tools",
                   "tests.cli_app:hand_tools", "--port", port)  # fmt: skip
        assert hand.returncode == 4 and "cannot listen" in error_line(hand)
        metrics = cli("worker", "--app", APP, "--metrics-port", port, store=url)
        assert metrics.returncode == 4
        assert error_line(metrics).endswith("pick another --metrics-port"), metrics.stderr


def test_wake_postgres_defaults_to_the_store_url() -> None:
    from wakeful.cli.services import _wake
    from wakeful.fleet.pgwake import PostgresWake

    store = "postgresql://app@db.example/app"
    wake = _wake("postgres", None, store)
    assert isinstance(wake, PostgresWake) and wake.dsn == store
    assert _wake("postgres", "postgresql://other/db", store).dsn == "postgresql://other/db"
    done = cli("worker", "--app", APP, "--wake", "postgres", store="sqlite:///x.db")
    assert done.returncode == 2 and "is not PostgreSQL" in error_line(done)


def test_submit_warns_about_an_unknown_target_and_no_live_worker(url: str) -> None:
    unknown = cli("submit", "t-1", "nosuch", "hi", "--app", APP, store=url)
    assert unknown.returncode == 0, unknown.stderr
    [dispatch_id] = re.findall(r"^submitted (d-\w+)", unknown.stdout)
    warnings = unknown.stderr.splitlines()
    assert warnings[0].startswith("warning: target 'nosuch' is not in tests.cli_app:registry")
    assert warnings[0].endswith(f"refuses dispatch {dispatch_id}")
    assert warnings[1].startswith(f"warning: no live worker in {url}: dispatch {dispatch_id}")
    assert len(warnings) == 2

    async def register() -> None:
        async with open_store(url) as store:
            await store.register_worker("w-live")

    asyncio.run(register())  # a heartbeat just now: live
    known = cli("submit", "t-2", "greeter", "hi", "--app", APP, store=url)
    assert (known.returncode, known.stderr) == (0, "")


def test_serving_the_network_without_tokens_is_refused(tmp_path: Path) -> None:
    port, nowhere = str(free_port()), "foo://x"  # a store that ends the command if it is reached
    done = cli("serve", "--host", "0.0.0.0", "--port", port, "--store", nowhere)
    assert done.returncode == 2, done.stderr
    line = error_line(done)
    assert "without tokens" in line and "--allow-unauthenticated-network" in line
    hand = cli("hand", "serve", "--ledger", str(tmp_path / "h.db"), "--tools",
               "tests.cli_app:hand_tools", "--host", "0.0.0.0", "--port", port)  # fmt: skip
    assert hand.returncode == 2 and "refusing to serve the hand" in error_line(hand)
    assert not (tmp_path / "h.db").exists()
    allowed = cli("serve", "--host", "0.0.0.0", "--port", port, "--allow-unauthenticated-network",
                  "--store", nowhere)  # fmt: skip
    assert allowed.returncode == 6 and "unknown scheme" in error_line(allowed)
    tokens = tmp_path / "tokens.json"
    tokens.write_text('{"operator-token-1": "*"}', encoding="utf-8")
    with_tokens = cli("serve", "--host", "::", "--port", port, "--tokens", str(tokens),
                      "--allowed-host", "http://api.example.com")  # fmt: skip
    assert with_tokens.returncode == 2 and "--allowed-host" in error_line(with_tokens)


def test_postgres_that_is_unreachable_or_refuses_is_told_apart() -> None:
    postgres_dsn()  # skips (or fails under WAKEFUL_REQUIRE_SERVICES) without a server
    host, user = POSTGRES_HOST, POSTGRES_USER
    unreachable = cli("threads", "list", store=f"postgresql://{user}@{host}:{free_port()}/x")
    assert unreachable.returncode == 5, unreachable.stderr
    assert "cannot reach PostgreSQL" in error_line(unreachable)
    assert "retry later" in unreachable.stderr
    server = f"{host}:{POSTGRES_PORT}"
    refused = cli("threads", "list", store=f"postgresql://{user}@{server}/wakeful_i17_nodb")
    assert refused.returncode == 6 and "does not exist" in error_line(refused)
    assert "retry later" not in refused.stderr and "retrying will not help" in refused.stderr
    login = cli("migrate", store=f"postgresql://no_such_role_i17@{server}/postgres")
    assert login.returncode == 6 and "no_such_role_i17" in error_line(login)


# ------------------------------------------------------------------------ workflow


def test_submit_resume_cancel_and_send(url: str) -> None:
    submitted = as_json(cli("submit", "t-1", "tally", "--input", '{"numbers": [2]}', "--json",
                            "--dispatch-id", "d-sub", store=url))  # fmt: skip
    assert submitted["status"] == "pending" and submitted["payload"]["input"] == {"numbers": [2]}
    human = cli("submit", "t-1", "tally", "--input", '{"numbers": [2]}', "--dispatch-id", "d-sub",
                "--verbose", store=url)  # fmt: skip
    assert human.returncode == 0 and '{"target":"tally"' in human.stdout  # JSON, not a repr
    drain(url, "d-sub")
    assert as_json(cli("threads", "show", "t-1", "--json", store=url))["checkpoint"]["state"] == {
        "numbers": [2],
        "total": 2,
    }
    # suspend, then resume with an answer
    cli("submit", "t-q", "asker", "--dispatch-id", "d-ask", store=url)
    drain(url, "d-ask")
    shown = cli("threads", "show", "t-q", store=url)
    assert "open ticket" in shown.stdout and "Proceed?" in shown.stdout
    ticket = as_json(cli("threads", "show", "t-q", "--json", store=url))["checkpoint"]["metadata"][
        "tickets"
    ][0]["id"]
    wrong = cli("resume", "t-q", "--answers", '{"nope": 1}', store=url)
    assert wrong.returncode == 4 and "no open tickets" in error_line(wrong)
    resumed = as_json(cli("resume", "t-q", "--answers", json.dumps({ticket: "yes"}), "--json",
                          store=url))  # fmt: skip
    assert resumed["kind"] == "resume"
    drain(url, resumed["dispatch_id"])
    state = as_json(cli("threads", "show", "t-q", "--json", store=url))["checkpoint"]
    assert state["status"] == "completed" and state["state"] == {"answer": "yes"}
    again = cli("resume", "t-q", "--answers", "{}", store=url)
    assert again.returncode == 4 and "not suspended" in error_line(again)
    # cancel a suspended run
    cli("submit", "t-c", "asker", "--dispatch-id", "d-c", store=url)
    drain(url, "d-c")
    cancel = as_json(cli("cancel", "t-c", "--reason", "no longer needed", "--json", store=url))
    assert cancel["kind"] == "cancel"
    drain(url, cancel["dispatch_id"])
    assert as_json(cli("threads", "show", "t-c", "--json", store=url))["checkpoint"]["status"] == (
        "cancelled"
    )
    runs = as_json(cli("threads", "runs", "t-c", "--json", store=url))
    assert [r["status"] for r in runs] == ["cancelled"]
    # a message from outside starts the thread's graph with the payload as input
    sent = as_json(cli("send", "t-1", '{"numbers": [10, 20]}', "--message-id", "m-1", "--json",
                       store=url))  # fmt: skip
    assert sent["kind"] == "message" and sent["payload"]["payload"] == {"numbers": [10, 20]}
    drain(url, sent["dispatch_id"])
    runs = as_json(cli("threads", "runs", "t-1", "--json", store=url))
    assert [r["status"] for r in runs] == ["completed", "completed"]
    assert (
        as_json(cli("threads", "show", "t-1", "--json", store=url))["checkpoint"]["state"]["total"]
        == 30
    )


def narrow(*args: str, store: str) -> str:
    """stdout of a command run without a terminal, 80 columns wide."""
    done = subprocess.run([WAKEFUL, *args], capture_output=True, text=True, timeout=60,
                          env=cli_env(store, COLUMNS="80"), cwd=ROOT)  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return done.stdout


def test_steering_commands_print_one_line_and_no_id_is_ever_cut(url: str) -> None:
    thread = "t-" + "long-thread-name-" * 3
    line = narrow("submit", thread, "greeter", "hi", store=url)
    found = re.fullmatch(r"submitted (d-[0-9a-f]{32}) \(run run-(d-[0-9a-f]{32})\)\n", line)
    assert found is not None and found[1] == found[2], line
    dispatch_id = found[1]
    shown = as_json(cli("dispatches", "show", dispatch_id, "--json", store=url))
    listing = narrow("dispatches", "list", store=url)
    assert dispatch_id in listing and thread in listing and "…" not in listing
    table = narrow("dispatches", "show", dispatch_id, store=url)
    assert shown["created_at"] in table and "…" not in table
    verbose = narrow("submit", thread, "greeter", "hi", "--dispatch-id", dispatch_id, "--verbose",
                     store=url)  # fmt: skip
    assert dispatch_id in verbose and '{"target":"greeter"' in verbose and "…" not in verbose
    assert as_json(cli("run", "t-c", "asker", "--app", APP, "--json", store=url))["status"] == (
        "suspended"
    )
    cancelled = re.fullmatch(
        r"cancelling t-c: dispatch (\S+)\n", narrow("cancel", "t-c", store=url)
    )
    assert cancelled is not None
    assert as_json(cli("dispatches", "show", cancelled[1], "--json", store=url))["kind"] == "cancel"


def test_messages_listings_and_status(url: str) -> None:
    assert cli("run", "t-m", "greeter", "hello", "--app", APP, store=url).returncode == 0
    messages = as_json(cli("threads", "messages", "t-m", "--json", store=url))
    assert [(m["role"], m["content"]) for m in messages] == [
        ("user", "hello"),
        ("assistant", "Hello from the command line."),
    ]
    assert "Hello from the command line." in cli("threads", "messages", "t-m", store=url).stdout

    async def workers() -> None:
        old = ManualClock(datetime.now(UTC) - timedelta(hours=1))
        async with open_store(url, clock=old) as s:
            await s.register_worker("w-gone")
        async with open_store(url) as s:
            await s.register_worker("w-live")
            await submit(s, "t-p", "greeter", "hi", dispatch_id="d-pending")

    asyncio.run(workers())
    live = as_json(cli("workers", "list", "--json", store=url))
    assert "w-live" in [w["worker_id"] for w in live]
    assert "w-gone" not in [w["worker_id"] for w in live]
    every = {w["worker_id"]: w["state"] for w in as_json(cli("workers", "list", "--all", "--json",
                                                             store=url))}  # fmt: skip
    assert every["w-gone"] == "expired" and every["w-live"] == "alive"
    assert "expired" in cli("workers", "list", "--all", store=url).stdout
    status = as_json(cli("status", "--json", store=url))
    assert status["store"] == url and status["schema_version"] >= 1
    assert status["queue"]["pending"] == 1 and status["queue"]["done"] == 1
    assert "w-live" in status["live_workers"] and "w-gone" not in status["live_workers"]
    assert status["leases_held"] == 0
    assert "queue: pending" in cli("status", store=url).stdout


def test_a_worker_that_stopped_gracefully_is_listed_as_stopped(url: str) -> None:
    async def run_and_stop() -> None:
        async with open_store(url) as store:
            w = Worker(store, registry(), worker_id="w-stops", poll_interval=0.05)
            running = asyncio.create_task(w.run())
            await w.started()
            await w.stop(5)
            await running
            await store.register_worker("w-runs")

    asyncio.run(run_and_stop())
    live = [w["worker_id"] for w in as_json(cli("workers", "list", "--json", store=url))]
    assert live == ["w-runs"]
    every = {w["worker_id"]: w for w in as_json(cli("workers", "list", "--all", "--json",
                                                    store=url))}  # fmt: skip
    assert every["w-stops"]["state"] == "stopped" and every["w-stops"]["stopped_at"]
    assert every["w-runs"]["state"] == "alive" and every["w-runs"]["stopped_at"] is None
    table = cli("workers", "list", "--all", store=url).stdout
    assert "w-stops" in table and "stopped" in table
    assert as_json(cli("status", "--json", store=url))["live_workers"] == ["w-runs"]


def test_migrate_prune_and_requeue_all_speak_json(url: str) -> None:
    migrated = as_json(cli("migrate", "--json", store=url))
    assert migrated["version"] >= 1
    pruned = as_json(cli("prune", "--dispatch-age", "0s", "--json", store=url))
    assert pruned == {"checkpoints": 0, "events": 0, "receipts": 0, "dispatches": 0}
    assert cli("prune", "--event-age", "soon", store=url).returncode == 2

    async def exhaust() -> None:
        async with open_store(url) as s:
            for i in range(3):
                await submit(s, f"t-{i}", "greeter", "hi", dispatch_id=f"d-{i}", max_attempts=1)
            assert len(await s.claim_next("crashed-worker", 0.001, 3)) == 3

    asyncio.run(exhaust())
    deadline = time.monotonic() + 10
    for i in range(3):
        while cli("quarantine", "add", f"d-{i}", store=url).returncode != 0:
            assert time.monotonic() < deadline  # the 1 ms leases must expire first
    requeued = as_json(cli("quarantine", "requeue", "--all", "--json", store=url))
    assert sorted(d["dispatch_id"] for d in requeued) == ["d-0", "d-1", "d-2"]
    assert {d["status"] for d in requeued} == {"pending"}
    assert cli("quarantine", "requeue", store=url).returncode == 2


# ---------------------------------------------------------------------- follow


def test_events_follow_tails_new_events_until_sigterm(url: str) -> None:
    assert cli("migrate", store=url).returncode == 0  # a read never creates the store
    proc = subprocess.Popen(
        [WAKEFUL, "threads", "events", "t-f", "--follow", "--json"],
        cwd=ROOT,
        env=cli_env(url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # the thread does not exist yet: the tail says that it waits, instead of nothing
        assert proc.stderr is not None
        assert proc.stderr.readline() == f"waiting for thread t-f to exist in {url}\n"
        assert cli("run", "t-f", "greeter", "hi", "--app", APP, store=url).returncode == 0
        seen: list[dict[str, Any]] = []
        assert proc.stdout is not None
        while not seen or seen[-1]["type"] != "run.completed":
            line = proc.stdout.readline()  # the pytest timeout bounds this
            assert line, proc.stderr.read() if proc.stderr else ""
            seen.append(json.loads(line))
        assert [e["seq"] for e in seen] == list(range(1, len(seen) + 1))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0


def test_follow_started_while_the_store_is_unreachable_waits_for_it() -> None:
    """The existence checks of --follow do not end a tail whose store is down: it says so
    and reconnects, as it does when the store goes away later."""
    store = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"
    proc = subprocess.Popen([WAKEFUL, "threads", "events", "t-1", "--follow"], cwd=ROOT,
                            env=cli_env(store), stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # the pytest timeout bounds this
        assert "store unavailable" in line and "reconnecting" in line, line
        assert proc.poll() is None, "the tail is still running"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0


def test_follow_resumes_after_the_store_was_unavailable(url: str) -> None:
    """The tail reopens the store after ``StoreUnavailable`` and continues after the last
    event it printed: no gap, no duplicate."""
    from wakeful.cli.follow import tail
    from wakeful.errors import StoreUnavailable

    asyncio.run(_three_runs(url))
    opened = {"n": 0}

    class Flaky:
        """``open_store``, whose first store fails after its first read of events."""

        def __init__(self, target: str) -> None:
            self.opening = open_store(target)

        async def __aenter__(self) -> Any:
            store = await self.opening.__aenter__()
            opened["n"] += 1
            if opened["n"] == 1:
                real = store.wait_events
                calls = {"n": 0}

                async def wait_events(*args: Any, **kwargs: Any) -> Any:
                    calls["n"] += 1
                    if calls["n"] > 1:
                        raise StoreUnavailable("the connection dropped")
                    return (await real(*args, **kwargs))[:2]

                store.wait_events = wait_events  # type: ignore[method-assign]
            return store

        async def __aexit__(self, *exc: object) -> None:
            await self.opening.__aexit__(*exc)

    lines: list[str] = []

    async def follow() -> None:
        task = asyncio.create_task(tail(url, "t-1", 0, lines.append, as_json=True,
                                        opener=Flaky, retry_delay=0.01))  # fmt: skip
        deadline = time.monotonic() + 20
        while len(lines) < 9:
            assert time.monotonic() < deadline, lines
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(follow())
    assert opened["n"] >= 2
    assert [json.loads(line)["seq"] for line in lines] == list(range(1, 10))


async def _three_runs(url: str) -> None:
    async with open_store(url) as s:
        for i in range(3):
            await submit(s, "t-1", "tally", {"numbers": [i]}, dispatch_id=f"d-{i}")
        wake = LocalWake()
        w = Worker(s, registry(), concurrency=1, wake=wake, poll_interval=0.05)
        running = asyncio.create_task(w.run())
        deadline = time.monotonic() + 30
        while len(await s.list_dispatches(status="done")) < 3:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        await w.stop(5)
        await running
        assert len(await s.events_after("t-1", 0, 100)) == 9  # started, task, completed x 3


def test_every_option_has_help() -> None:
    import click

    from wakeful.cli import cli as root

    missing = []

    def walk(command: click.Command, path: str) -> None:
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, f"{path} {name}")
            return
        assert command.help, f"{path} has no help text"
        for param in command.params:
            if isinstance(param, click.Option) and not param.help and "--help" not in param.opts:
                missing.append(f"{path} {param.opts[0]}")

    walk(root, "wakeful")
    assert not missing, missing


def test_logging_options_on_every_command(url: str) -> None:
    assert cli("migrate", store=url).returncode == 0
    done = cli("threads", "list", "--log-level", "debug", "--log-format", "json", store=url)
    assert done.returncode == 0, done.stderr
    assert cli("status", "--log-level", "loud", store=url).returncode == 2


def test_command_log_lines_name_their_trace_when_tracing_is_on() -> None:
    import logging

    from opentelemetry.sdk.trace import TracerProvider

    from wakeful import telemetry
    from wakeful.cli.logs import JsonFormatter, TextFormatter, configure

    configure("info", "json")
    handler = logging.getLogger().handlers[0]
    record = logging.LogRecord("wakeful.fleet", logging.INFO, __file__, 1, "hello", (), None)
    handler.filter(record)
    assert "trace_id" not in json.loads(JsonFormatter().format(record))
    telemetry.configure(TracerProvider())
    try:
        span = telemetry.start("work", {})
        with telemetry.use(span):
            record = logging.LogRecord("wakeful.fleet", logging.INFO, __file__, 1, "hi", (), None)
            handler.filter(record)
        telemetry.finish(span, None)
        entry = json.loads(JsonFormatter().format(record))
        assert len(entry["trace_id"]) == 32 and len(entry["span_id"]) == 16
        assert f"[trace_id={entry['trace_id']} " in TextFormatter().format(record)
    finally:
        telemetry.configure(None)
        configure("warning", "text")
