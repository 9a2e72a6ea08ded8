"""Cross-process and cross-connection races on the PostgreSQL store: real processes, each with
its own pool, started together; the assertions are about what the database holds."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.postgres_support import ROOT, Databases, open_test_store
from wakeful.errors import ThreadBusy
from wakeful.records import Dispatch, Done, Lease

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]


def _run_children(commands: list[list[str]], go: Path, deadline: float = 90.0) -> list[object]:
    """Start every child, wait until all are ready, release them together, and return each
    one's JSON result."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.postgres_child", *cmd],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for cmd in commands
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.strip() == "ready", (line, proc.stderr.read() if proc.stderr else "")
        go.touch()
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=deadline)
            assert proc.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


async def test_eight_processes_race_for_twenty_threads_one_winner_each(
    pg_databases: Databases, tmp_path: Path
) -> None:
    dsn = await pg_databases.clone()
    threads = [f"t-{i:02}" for i in range(20)]
    go = tmp_path / "go"
    commands = [["claim", dsn, str(go), f"proc-{p}", *threads] for p in range(8)]
    results = await asyncio.to_thread(_run_children, commands, go)
    winners: dict[str, list[str]] = {t: [] for t in threads}
    for p, won in enumerate(results):
        assert isinstance(won, list)
        for item in won:
            winners[item["thread"]].append(f"proc-{p}")
            assert item["token"] == 1
    assert all(len(w) == 1 for w in winners.values()), winners
    store = await open_test_store(dsn)
    try:
        for thread_id, [holder] in winners.items():
            snap = await store.read(thread_id)
            assert snap is not None and snap.claim is not None
            assert snap.claim.holder == holder and snap.claim.token == 1
            with pytest.raises(ThreadBusy) as busy:
                await store.claim(thread_id, "late", 30)
            assert busy.value.holder == holder
    finally:
        await store.close()


async def test_four_processes_drain_500_dispatches_each_leased_exactly_once(
    pg_databases: Databases, tmp_path: Path
) -> None:
    dsn = await pg_databases.clone()
    store = await open_test_store(dsn)
    try:
        # four dispatches per thread: claimers also contend for the thread claims
        ids = [f"d-{i:03}" for i in range(500)]
        for i, did in enumerate(ids):
            await store.enqueue(
                Dispatch(dispatch_id=did, thread_id=f"t-{i % 125:03}", kind="start", payload=i)
            )
        go = tmp_path / "go"
        commands = [["drain", dsn, str(go), f"worker-{w}"] for w in range(4)]
        results = await asyncio.to_thread(_run_children, commands, go)
        leased = [did for got in results if isinstance(got, list) for did in got]
        assert len(leased) == len(set(leased)) == 500
        assert sorted(leased) == ids
        assert all(len(got) > 0 for got in results if isinstance(got, list)), "all took part"
        stored = await store.list_dispatches(limit=1000)
        assert len(stored) == 500
        assert all(d.status == "done" and d.attempts == 1 for d in stored)
    finally:
        await store.close()


async def test_concurrent_claim_next_never_leases_one_thread_twice(
    pg_databases: Databases,
) -> None:
    """Claimers on separate pools race over threads that each have several dispatches: at
    any moment at most one lease per thread, and every grant is the thread's claim."""
    dsn = await pg_databases.clone()
    stores = [await open_test_store(dsn) for _ in range(4)]
    try:
        for i in range(120):
            await stores[0].enqueue(
                Dispatch(dispatch_id=f"d-{i:03}", thread_id=f"t-{i % 10}", kind="start")
            )
        held: dict[str, Lease] = {}
        violations: list[str] = []
        done: list[str] = []

        async def worker(w: int) -> None:
            store = stores[w % len(stores)]
            idle = 0
            while idle < 50:
                leases = await store.claim_next(f"w-{w}", 60, limit=3)
                if not leases:
                    idle += 1
                    await asyncio.sleep(0.002)
                    continue
                idle = 0
                for lease in leases:
                    if lease.claim.thread_id in held:
                        violations.append(lease.claim.thread_id)
                    held[lease.claim.thread_id] = lease
                await asyncio.sleep(0)
                for lease in leases:
                    del held[lease.claim.thread_id]
                    await store.settle(lease.dispatch.dispatch_id, lease.claim.token, Done())
                    done.append(lease.dispatch.dispatch_id)

        await asyncio.gather(*(worker(w) for w in range(8)))
        assert violations == []
        assert sorted(done) == [f"d-{i:03}" for i in range(120)]
    finally:
        for store in stores:
            await store.close()


async def test_wait_events_wakes_for_a_commit_in_another_process(
    pg_databases: Databases,
) -> None:
    dsn = await pg_databases.clone()
    store = await open_test_store(dsn)
    try:
        claim = await store.claim("t1", "writer", 60)
        waiter = asyncio.create_task(store.wait_events("t1", 0, timeout=30))
        assert await store.listener.ready(10)
        script = (
            "import asyncio, sys\n"
            "from wakeful.records import Commit, EventDraft\n"
            "from wakeful.store.postgres import open_postgres_store\n"
            "async def main():\n"
            "    s = await open_postgres_store(sys.argv[1], pool_size=1, migrate=False)\n"
            f"    await s.commit('t1', Commit(token={claim.token},"
            " events=(EventDraft(type='from-child'),)))\n"
            "    await s.close()\n"
            "asyncio.run(main())\n"
        )
        child = await asyncio.create_subprocess_exec(sys.executable, "-c", script, dsn, cwd=ROOT)
        assert await asyncio.wait_for(child.wait(), 60) == 0
        events = await asyncio.wait_for(waiter, 30)
        assert [e.type for e in events] == ["from-child"]
    finally:
        await store.close()
