"""What a drain costs the PostgreSQL server: transactions and backend CPU per job.

``ServerCost(admin_dsn, dbname)`` is a context manager around one drain. Entering it reads
the database's transaction count (``pg_stat_database``) and starts a thread that reads, every
``SAMPLE_EVERY`` seconds, the CPU time of every backend serving ``dbname`` (found in
``pg_stat_activity`` through a connection to the admin database, so the sampler's own backend
is never counted) from ``/proc/<pid>/schedstat`` (nanoseconds on the CPU, readable for any
process of the machine). A backend seen at entry counts from its value then; one that appears
later counts from zero (its start-up is part of the drain's cost); one that exits counts up to
its last sample. ``cost.per_job(n)`` gives ``(transactions, server CPU seconds)`` per job.

``ProcessCpu(pids)`` is the same for the drain's own client processes.

The server must run on this machine (the default benchmark server does); elsewhere the CPU
figure is ``None`` and only transactions are reported.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Self

import psycopg

from benchmarks.common import Collector

SAMPLE_EVERY = 0.01
"""Seconds between reads of the backends' CPU time."""
DISCOVER_EVERY = 0.05
"""Seconds between looks for the database's backends."""


def cpu_ns(pid: int) -> int | None:
    """The process's time on a CPU, in nanoseconds, or None when it is gone (or unreadable)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def local_server(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    """Whether the server's postmaster is a process of this machine (its pid is readable)."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    return row is not None and cpu_ns(int(str(row[0]))) is not None


def transactions(conn: psycopg.Connection[tuple[object, ...]], dbname: str) -> int:
    """Committed and rolled back transactions of ``dbname`` so far (flushed statistics)."""
    row = conn.execute(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", (dbname,)
    ).fetchone()
    assert row is not None
    return int(str(row[0]))


class ProcessCpu:
    """CPU seconds of a fixed set of processes between ``start()`` and ``stop()``."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self._start: dict[int, int] = {}
        self.seconds = 0.0

    def start(self) -> None:
        self._start = {pid: cpu_ns(pid) or 0 for pid in self.pids}

    def stop(self) -> float:
        used = sum((cpu_ns(pid) or start) - start for pid, start in self._start.items())
        self.seconds = used / 1e9
        return self.seconds


class ServerCost:
    """Transactions and backend CPU of ``dbname`` during a ``with`` block (see the module)."""

    def __init__(self, admin_dsn: str, dbname: str) -> None:
        self.admin_dsn = admin_dsn
        self.dbname = dbname
        self.transactions = 0
        self.cpu_seconds: float | None = None
        self._first: dict[int, int] = {}
        self._last: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._tx_before = 0
        self._local = False
        self.clients: float | None = None
        """CPU seconds of the drain's own client processes, when the caller measured them."""

    def _backends(self) -> list[int]:
        assert self._conn is not None
        rows = self._conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.dbname,)
        ).fetchall()
        return [int(str(pid)) for (pid,) in rows]

    def _sample(self, pids: list[int], baseline: bool) -> None:
        for pid in pids:
            used = cpu_ns(pid)
            if used is None:
                continue
            if pid not in self._first:
                self._first[pid] = used if baseline else 0
            self._last[pid] = used

    def _run(self) -> None:
        pids = self._backends()
        discovered = time.monotonic()
        while not self._stop.wait(SAMPLE_EVERY):
            if time.monotonic() - discovered >= DISCOVER_EVERY:
                pids = sorted(set(pids) | set(self._backends()))
                discovered = time.monotonic()
            self._sample(pids, baseline=False)
        self._sample(sorted(set(pids) | set(self._backends())), baseline=False)

    def __enter__(self) -> Self:
        self._conn = psycopg.connect(self.admin_dsn, autocommit=True)
        self._local = local_server(self._conn)
        self._tx_before = transactions(self._conn, self.dbname)
        if self._local:
            self._sample(self._backends(), baseline=True)
            self._thread = threading.Thread(target=self._run, name="server-cost", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        assert self._conn is not None
        try:
            if kind is None:
                time.sleep(0.5)  # the drain's sessions ended: their statistics are flushed
                self.transactions = transactions(self._conn, self.dbname) - self._tx_before
                if self._local:
                    used = sum(self._last[pid] - self._first[pid] for pid in self._last)
                    self.cpu_seconds = used / 1e9
        finally:
            self._conn.close()

    def per_job(self, n: int) -> tuple[float, float | None]:
        """(transactions, server CPU seconds) per job of a drain of ``n`` jobs."""
        cpu = None if self.cpu_seconds is None else self.cpu_seconds / n
        return self.transactions / n, cpu


Costs = dict[tuple[str, int, str], list[float]]
"""(system, concurrency, what) -> one value per round; what: tx, server, clients."""


def record_cost(costs: Costs, key: tuple[str, int], cost: ServerCost, n: int) -> None:
    """Add one drain's per-job figures to ``costs`` under ``key`` (system, concurrency)."""
    tx, server = cost.per_job(n)
    costs.setdefault((*key, "tx"), []).append(tx)
    if server is not None:
        costs.setdefault((*key, "server"), []).append(server * 1e6)
    if cost.clients is not None:
        costs.setdefault((*key, "clients"), []).append(cost.clients / n * 1e6)


WHAT = {
    "tx": ("PostgreSQL transactions per job", "tx",
           "pg_stat_database xact_commit + xact_rollback during the drain / jobs"),
    "server": ("PostgreSQL server CPU per job", "us",
               "the database's backends, /proc/<pid>/schedstat during the drain / jobs"),
    "clients": ("worker processes' CPU per job", "us",
                "the two worker processes, /proc/<pid>/schedstat during the drain / jobs"),
}  # fmt: skip


def add_costs(
    out: Collector,
    costs: Costs,
    systems: list[str],
    concurrency: int,
    workers: int,
    ours: str,
    targets: dict[str, float] | None = None,
) -> None:
    """Report ``costs`` at ``concurrency``: each figure of each system, and for the server
    CPU, ``ours`` against each other system (lower is better; ``targets``: other system ->
    the ratio to stay under)."""
    for what, (title, unit, note) in WHAT.items():
        for system in systems:
            values = costs.get((system, concurrency, what))
            if not values:
                continue
            name = f"{title}, {system}, {workers} processes x {concurrency}"
            out.add(name, values, unit, higher_is_better=False, note=note)
    mine = costs.get((ours, concurrency, "server"))
    for system in systems:
        theirs = costs.get((system, concurrency, "server"))
        if system == ours or not mine or not theirs:
            continue
        out.add(
            f"PostgreSQL server CPU per job, {ours} vs {system}, {workers} processes x "
            f"{concurrency}",
            mine,
            "us",
            higher_is_better=False,
            anchor=f"{system}, {workers} processes x {concurrency}",
            anchor_samples=theirs,
            target=(targets or {}).get(system),
        )


def print_costs(costs: Costs) -> None:
    for (system, concurrency, what), values in sorted(costs.items()):
        title, unit, _ = WHAT[what]
        values = sorted(values)
        print(f"  {system}, {concurrency} per worker: {title} {values[len(values) // 2]:,.2f} "
              f"{unit}")  # fmt: skip
