"""Failover (issue 41): three times under a steady load, the primary of a private
synchronous pair is killed with SIGKILL and its standby promoted; the store, two worker
processes and their wakes all use one multi-host URL with
``target_session_attrs=read-write`` and find the new primary without a restart. Every
acknowledged commit and submission is on the last primary, every run ends once, the
``replay="never"`` tool ran at most once per run (once per completed run), and the seconds
from each kill to the first commit on the new primary are printed (the ``failover``
benchmark runs the same scenario: ``python -m benchmarks.failover``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path

import psycopg
import pytest

from tests import failover_scenario
from tests.pgcluster import Node, require_binaries
from wakeful import open_store

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.mark.timeout(240)
@pytest.mark.asyncio
async def test_three_failovers_under_load_lose_no_acknowledged_commit(tmp_path: Path) -> None:
    require_binaries()
    report = await failover_scenario.run(tmp_path, rounds=3)
    print("failover:", json.dumps(report.summary()))
    assert len(report.kill_to_commit) == 3
    assert len(report.ledger) > 20 and len(report.submitted) >= len(report.ledger) + 3
    assert sum(report.endings.values()) == len(report.submitted)
    assert sum(s["done"] for s in report.worker_stats) >= report.endings.get("run.completed", 0)
    assert all(0 < s < 30 for s in report.kill_to_commit), report.kill_to_commit


def walsender(primary: Node) -> int:
    """The pid of the primary's WAL sender (pausing it holds the WAL back on the primary;
    pausing the standby's receiver would not: the socket buffers what was sent)."""
    for pid in primary._stats():
        with contextlib.suppress(OSError):
            if b"walsender" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    raise AssertionError("the primary has no WAL sender")


@pytest.mark.timeout(120)
@pytest.mark.asyncio
async def test_asynchronous_replication_loses_what_the_docs_say_and_doctor_warned() -> None:
    """The window documented in docs/postgres-store.md, made deterministic: the primary's
    WAL sender is paused, two commits and a claim are acknowledged by the primary alone,
    the primary is killed and the standby promoted. The commits are gone and the next
    claim is handed the very token the lost claim had: no fencing between those two
    holders. The store's server report said beforehand that replication was asynchronous."""
    require_binaries()
    primary = await asyncio.to_thread(Node.init)
    standby: Node | None = None
    try:
        await asyncio.to_thread(primary.start)
        standby = await asyncio.to_thread(Node.standby_of, primary)
        await asyncio.to_thread(standby.start)
        await asyncio.to_thread(primary.wait_synchronous_standby)
        await asyncio.to_thread(primary.set_synchronous, "")
        with psycopg.connect(primary.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {failover_scenario.DB}")
        url = failover_scenario.multi_host(primary, standby)
        store = await open_store(url, pool_size=2)
        try:
            report = await store.server_report()  # type: ignore[attr-defined]
            assert report.replication == "asynchronous"
            assert "failover can lose" in report.warnings[0]
            claim = await store.claim("t", "w1", ttl=600)
            for v in (1, 2):
                await store.commit("t", failover_scenario.ledger_commit(claim.token, v))
            await asyncio.to_thread(replayed, standby, 2)
            os.kill(walsender(primary), signal.SIGSTOP)  # SIGKILL below ends it
            for v in (3, 4):  # acknowledged by the primary alone
                await store.commit("t", failover_scenario.ledger_commit(claim.token, v))
            lost_claim = await store.claim("u", "w1", ttl=600)
            await asyncio.to_thread(primary.kill)
            await asyncio.to_thread(standby.promote)
            # it inherited synchronous_standby_names: without a standby, commits would wait
            await asyncio.to_thread(standby.set_synchronous, "")
            snapshot = await failover_scenario.until_acknowledged(
                lambda: store.read("t"), time.monotonic() + 30
            )
            assert snapshot is not None and snapshot.version == 2, "commits 3 and 4 are lost"
            again = await store.claim("u", "w2", ttl=600)
            assert again.token == lost_claim.token, "the lost claim's token is handed out again"
        finally:
            await store.close()
    finally:
        for node in (primary, standby):
            if node is not None:
                await asyncio.to_thread(node.remove)


def replayed(standby: Node, version: int, deadline: float = 30.0) -> None:
    """Wait until the standby has replayed ``version`` of thread ``t`` (and, before that,
    the database and the migrations that created the table)."""
    end = time.monotonic() + deadline
    while True:
        try:
            with psycopg.connect(standby.url(failover_scenario.DB), autocommit=True) as conn:
                row = conn.execute(
                    "SELECT coalesce(max(version), 0) FROM wakeful.checkpoints"
                    " WHERE thread_id = 't'"
                ).fetchone()
        except (psycopg.errors.UndefinedTable, psycopg.OperationalError):
            row = None  # not replayed that far yet
        if row is not None and row[0] >= version:
            return
        assert time.monotonic() < end, "the standby did not replay"
        time.sleep(0.02)
