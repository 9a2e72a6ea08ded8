"""Counter: WAL pages the SQLite store writes per commit (counted, not timed).

Run ``python -m benchmarks.sqlite_pages [--threads 8] [--steps 50]``. It opens a store
(creating it with the shipped migrations), then runs the store's own commit job
(``wakeful.store.sqlite.threads``) on a connection of its own with automatic checkpoints
off, so the WAL only grows: the pages a transaction wrote are the frames the WAL gained
(``(size - 32) / (page_size + 24)``). Two shapes, each alone (one commit per transaction,
as a sequential writer) and in groups of ``--threads`` commits on as many threads in one
transaction (as the store's writer groups concurrent commits, decision 0003):

- ``checkpoint``: a commit with a new checkpoint of about 1.5 KB of state, no operation id
  (``benchmarks.sqlite_store``'s commit);
- ``graph step``: a commit with a small checkpoint, one event and an operation id (what the
  runtime commits after a graph node, ``benchmarks.runtime_graph``).

Runs against any wakeful checkout (``PYTHONPATH=<its src>``) to compare schemas.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.common import payload
from wakeful.records import Checkpoint, Commit, EventDraft
from wakeful.store.sqlite import open_sqlite_store
from wakeful.store.sqlite import threads as jobs
from wakeful.store.validate import encode_commit


def _frames(conn: sqlite3.Connection, wal: Path) -> int:
    page = int(conn.execute("PRAGMA page_size").fetchone()[0])
    size = wal.stat().st_size if wal.exists() else 0
    return max(0, size - 32) // (page + 24)


def _commit(conn: sqlite3.Connection, tid: str, token: int, parent: str | None, shape: str) -> str:
    now = datetime.now(UTC)
    big = shape == "checkpoint"
    cp = Checkpoint(
        id=uuid.uuid4().hex,
        parent=parent,
        run_id="bench",
        status="running",
        state=payload() if big else {"step": 1, "note": "x" * 40},
        created_at=now,
    )
    commit = Commit(
        token=token,
        checkpoint=cp,
        events=() if big else (EventDraft(type="node.finished", data={"node": "a"}, run_id="r"),),
        operation_id=None if big else uuid.uuid4().hex,
    )
    jobs.commit(conn, now, tid, encode_commit(tid, commit))
    return cp.id


def count(path: Path, shape: str, threads: int, steps: int) -> tuple[float, float, float, float]:
    """Pages per transaction (one commit each, ``threads`` commits each), then the process
    CPU per commit in µs of each (the commit jobs and the ``COMMIT``s, as the store's writer
    thread runs them; on tmpfs, where an fsync costs nothing, that is all of it)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("PRAGMA synchronous = FULL")
    wal = Path(f"{path}-wal")
    tokens: dict[str, int] = {}
    parents: dict[str, str | None] = {}
    names = [f"{shape.replace(' ', '-')}-{i}" for i in range(threads)]
    conn.execute("BEGIN IMMEDIATE")
    for tid in names:
        tokens[tid] = jobs.claim(conn, datetime.now(UTC), tid, "pages", 3600).token
        parents[tid] = None
    conn.execute("COMMIT")
    for tid in names:  # the first commit of each thread (it sets the one-time columns)
        conn.execute("BEGIN IMMEDIATE")
        parents[tid] = _commit(conn, tid, tokens[tid], parents[tid], shape)
        conn.execute("COMMIT")
    results = []
    cpu = []
    for group in (1, threads):
        before = _frames(conn, wal)
        transactions = 0
        started = time.process_time()
        for _ in range(steps):
            for first in range(0, threads, group):
                conn.execute("BEGIN IMMEDIATE")
                for tid in names[first : first + group]:
                    parents[tid] = _commit(conn, tid, tokens[tid], parents[tid], shape)
                conn.execute("COMMIT")
                transactions += 1
        cpu.append((time.process_time() - started) * 1e6 / (steps * threads))
        results.append((_frames(conn, wal) - before) / transactions)
    conn.close()
    return results[0], results[1], cpu[0], cpu[1]


async def _create(path: Path) -> None:
    store = await open_sqlite_store(f"sqlite:///{path}")
    await store.close()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--dir", default=None, help="where the databases go (default: $TMPDIR)")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="wakeful-pages-", dir=args.dir) as tmp:
        for shape in ("checkpoint", "graph step"):
            path = Path(tmp) / f"{shape.replace(' ', '-')}.db"
            asyncio.run(_create(path))
            alone, grouped, cpu_alone, cpu_grouped = count(path, shape, args.threads, args.steps)
            out[shape] = (alone, grouped, cpu_alone, cpu_grouped)
            print(
                f"{shape:>10}: {alone:5.1f} pages per commit alone, "
                f"{grouped:5.1f} per group of {args.threads} ({grouped / args.threads:.1f} each); "
                f"CPU per commit {cpu_alone:.0f} µs alone, {cpu_grouped:.0f} µs grouped"
            )
    return out


if __name__ == "__main__":
    main()
