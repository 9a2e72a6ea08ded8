"""Dispatch throughput of the worker fleet beside pgqueuer and procrastinate, and the time a
killed worker's run takes to resume in another worker process.

Run ``python -m benchmarks.dispatch [--n 2000] [--n-single 500] [--rounds 3] [--dsn URL]
[--kill-trials 3] [--gc worker|python|A,B,C]``.

Throughput: ``--n`` dispatches (``--n-single`` at one run per worker) of a trivial one-node
graph are submitted (untimed), then two worker processes (``Worker(..., concurrency=C,
wake=LocalWake())``, relay off) are told to go at the same instant and drain the queue;
dispatches/s = n / (go -> the later worker's drain returned). A dispatch is ``claim_next``
(leasing the dispatch, claiming its fresh thread and reading it, for up to the free slots
at once), the admission commit, and the commit of the node's result with the final
checkpoint that also settles the dispatch ``Done`` (decision 0004): every step durable.
The wakeful worker processes set the garbage collector as ``wakeful worker`` does by default
(``--gc worker``: ``wakeful.fleet.gctune``; ``--gc python`` leaves Python's settings).
The node is an ``async def`` no-op, as are the pgqueuer and procrastinate jobs. C is
1 and 10 runs per worker, on SQLite (a fresh file) and PostgreSQL (a fresh database). In the
same run, on the same server, the same number of no-op jobs is drained by two pgqueuer
processes (asyncpg driver, ``QueueManager.run(mode=drain)``) and two procrastinate processes
(``run_worker_async(wait=False)``), each in its own fresh database, with their default
settings otherwise. Rounds interleave every configuration; medians are reported. Every
measurement checks that each job ran exactly once and is recorded finished, and fails loudly
otherwise.

pgqueuer cannot cap one worker at a single task (``max_concurrent_tasks`` must be at least
twice the dequeue batch), so at C=1 its entrypoint's ``concurrency_limit=2`` (enforced in
SQL across both workers) caps the two processes at two jobs in flight; at C=10 each worker
runs ``batch_size=5, max_concurrent_tasks=10``.

Recovery: two worker processes with ``ClaimPolicy(ttl=2, renew_every=0.5)`` and
``poll_interval=0.25``; a run enters a node that never returns on its first call; between
0.2 and 1.0 s later (so the kill lands at any phase of the renewal cycle) the process
running it gets SIGKILL; measured: SIGKILL -> the node entered again by the other process
(the run recovered, its finished tasks reused), then the run must complete. Target: at most
ttl + 0.5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypedDict

import psycopg

from benchmarks.common import DEFAULT_DSN, Collector, Database, Result, rounds_argument
from benchmarks.pgcost import ProcessCpu, ServerCost, add_costs, print_costs, record_cost
from wakeful import open_store
from wakeful.fleet import LocalWake, Registry, Worker, gctune, submit
from wakeful.runtime import START, ClaimPolicy, Graph

ROOT = Path(__file__).resolve().parent.parent
WORKERS = 2
CONCURRENCIES = (1, 10)
KILL_TTL = 2.0
KILL_RENEW = 0.5
KILL_POLL = 0.25
CHILD_TIMEOUT = 180.0
SYSTEMS = ("wakeful sqlite", "wakeful postgres", "pgqueuer", "procrastinate")


class State(TypedDict):
    n: int


# ------------------------------------------------------------------ worker processes


def _emit(data: dict[str, Any]) -> None:
    print("RESULT " + json.dumps(data), flush=True)


async def _go() -> None:
    print("READY", flush=True)
    line = await asyncio.to_thread(sys.stdin.readline)
    if line.strip() != "go":
        raise SystemExit(f"expected 'go', got {line!r}")


def _noop_registry(counter: list[int]) -> Registry:
    # async, like the pgqueuer and procrastinate no-op jobs (a sync node would run in a
    # worker thread, which costs a thread hand-off per task)
    async def noop(state: dict[str, Any]) -> dict[str, Any]:
        counter[0] += 1
        return {"n": 1}

    graph = Graph(State, name="noop").node("noop", noop).edge(START, "noop").compile()
    return Registry().add("noop", graph)


async def _drained(worker: Worker) -> None:
    """Return once a claim call (made after this was called) found nothing and no run is in
    flight: the queue is empty for this worker (no retries in this benchmark). Told by the
    worker's own claim calls (the store's ``claim_next`` wrapped on the instance), not by
    polling: a 2 ms poll cost the drained process about 0.5 loop wake-ups per dispatch
    (decision 0022, eighth session)."""
    store = worker.store
    claim_next = store.claim_next
    own = vars(store).get("claim_next")  # (a store instance's own, to restore)
    drained = asyncio.get_running_loop().create_future()

    async def watched(*args: Any, **kwargs: Any) -> Any:
        leases = await claim_next(*args, **kwargs)
        if not leases and worker.busy == 0 and not drained.done():
            drained.set_result(None)
        return leases

    setattr(store, "claim_next", watched)  # noqa: B010  (an instance attribute, for this drain)
    try:
        await drained
    finally:
        if own is None:
            delattr(store, "claim_next")
        else:
            setattr(store, "claim_next", own)  # noqa: B010


async def wakeful_child(url: str, concurrency: int, gc_setting: str = "worker") -> None:
    counter = [0]
    async with open_store(url) as store:
        worker = Worker(
            store,
            _noop_registry(counter),
            concurrency=concurrency,
            claims=ClaimPolicy(ttl=30, renew_every=10),
            wake=LocalWake(),
            poll_interval=0.5,
            relay=False,
        )
        # as ``wakeful worker`` does by default (``--gc``, docs/operations.md)
        gctune.tune(gctune.parse(gc_setting))
        await _go()
        start = time.monotonic()
        running = asyncio.create_task(worker.run())
        drained = asyncio.create_task(_drained(worker))
        await asyncio.wait([running, drained], return_when=asyncio.FIRST_COMPLETED)
        if running.done():
            drained.cancel()
            await running  # raises what ended the worker early
        await worker.stop(grace=5)
        await running
        end = time.monotonic()
    stats = worker.stats
    _emit({"start": start, "end": end, "executed": counter[0], "done": stats.done,
           "retried": stats.retried, "fenced": stats.fenced})  # fmt: skip


async def pgqueuer_child(dsn: str, concurrency: int) -> None:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    executed = 0
    conn = await asyncpg.connect(dsn)
    try:
        qm = QueueManager(Queries(AsyncpgDriver(conn)))
        limit = 2 * concurrency if concurrency == 1 else 0

        async def noop(job: Job) -> None:
            nonlocal executed
            executed += 1

        qm.entrypoint("noop", concurrency_limit=limit)(noop)

        batch = max(concurrency // 2, 1)
        await _go()
        start = time.monotonic()
        await qm.run(
            batch_size=batch,
            max_concurrent_tasks=concurrency if concurrency >= 2 * batch else None,
            mode=QueueExecutionMode.drain,
            dequeue_timeout=timedelta(seconds=5),
        )
        end = time.monotonic()
    finally:
        await conn.close()
    _emit({"start": start, "end": end, "executed": executed, "done": executed})


def _procrastinate() -> Any:
    import procrastinate

    # The apps are made in this module, run as __main__: procrastinate warns about that
    # (it cannot find tasks by import path), which does not matter for named tasks.
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)
    return procrastinate


async def procrastinate_child(dsn: str, concurrency: int) -> None:
    procrastinate = _procrastinate()
    executed = 0
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    async def noop() -> None:
        nonlocal executed
        executed += 1

    app.task(name="noop")(noop)

    async with app.open_async():
        await _go()
        start = time.monotonic()
        await app.run_worker_async(
            concurrency=concurrency, wait=False, install_signal_handlers=False
        )
        end = time.monotonic()
    _emit({"start": start, "end": end, "executed": executed, "done": executed})


def _slow_registry(directory: Path) -> Registry:
    """``slow``: a -> hang. ``hang`` records each entry (pid and time) in ``directory``; the
    first entry of a trial never returns, later ones return at once."""

    def a(state: dict[str, Any]) -> dict[str, Any]:
        return {"n": state["n"]}

    def enter(trial: int) -> bool:
        """Record this entry; True if it is the trial's first."""
        first = not list(directory.glob(f"enter-{trial}-*"))
        at = repr(time.monotonic())
        path = directory / f"enter-{trial}-{os.getpid()}"
        partial = directory / f"partial-{trial}-{os.getpid()}"
        partial.write_text(at)
        partial.rename(path)  # atomic: the parent never reads it half-written
        return first

    async def hang(state: dict[str, Any]) -> dict[str, Any]:
        if enter(state["n"]):
            await asyncio.sleep(3600)
        return {"n": state["n"]}

    graph = Graph(State, name="slow").node("a", a).node("hang", hang)
    return Registry().add("slow", graph.edge(START, "a").edge("a", "hang").compile())


async def recovery_child(url: str, directory: Path, worker_id: str) -> None:
    async with open_store(url) as store:
        worker = Worker(
            store,
            _slow_registry(directory),
            concurrency=1,
            claims=ClaimPolicy(ttl=KILL_TTL, renew_every=KILL_RENEW),
            worker_id=worker_id,
            wake=LocalWake(),
            poll_interval=KILL_POLL,
            relay=False,
        )
        loop = asyncio.get_running_loop()
        stopping = loop.create_task(asyncio.Event().wait())
        loop.add_signal_handler(signal.SIGTERM, stopping.cancel)
        running = loop.create_task(worker.run())
        await worker.started()
        print("READY", flush=True)
        with contextlib.suppress(asyncio.CancelledError):
            await stopping
        await worker.stop(grace=1)
        await running
    _emit({"done": worker.stats.done})


async def _serve(system: str, gc_setting: str) -> None:
    """A worker process kept for the whole benchmark: each ``prepare TARGET C`` line sets up
    one drain (printing READY), ``go`` starts it, a RESULT line reports it; EOF ends.
    ``gc_setting``: the garbage collector's settings of a wakeful worker (``gctune``)."""
    runners: dict[str, Callable[[str, int], Awaitable[None]]] = {
        "wakeful": functools.partial(wakeful_child, gc_setting=gc_setting),
        "pgqueuer": pgqueuer_child,
        "procrastinate": procrastinate_child,
    }
    print("READY", flush=True)
    while line := await asyncio.to_thread(sys.stdin.readline):
        command, target, concurrency = line.split()
        if command != "prepare":
            raise SystemExit(f"expected 'prepare TARGET C', got {line!r}")
        await runners[system](target, int(concurrency))


def child_main(argv: list[str]) -> None:
    if argv[0] == "recovery":
        asyncio.run(recovery_child(argv[1], Path(argv[2]), argv[3]))
    elif argv[0] in ("wakeful", "pgqueuer", "procrastinate"):
        asyncio.run(_serve(argv[0], argv[1] if len(argv) > 1 else "worker"))
    else:
        raise SystemExit(f"unknown system {argv[0]!r}")


# ------------------------------------------------------------------ the parent


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.dispatch", "--child", *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def send(child: subprocess.Popen[str], line: str) -> None:
    assert child.stdin is not None
    child.stdin.write(line + "\n")
    child.stdin.flush()


def expect_ready(child: subprocess.Popen[str]) -> None:
    assert child.stdout is not None
    line = child.stdout.readline()
    if line.strip() != "READY":
        child.kill()
        raise RuntimeError(f"worker process failed to start (exit {child.wait()}): {line!r}")


def collect(child: subprocess.Popen[str]) -> dict[str, Any]:
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line.startswith("RESULT "):
        raise RuntimeError(f"worker process {child.pid} printed {line!r}, not a result")
    data: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return data


def reap(children: list[subprocess.Popen[str]]) -> None:
    for child in children:
        if child.poll() is None:
            child.kill()
        with contextlib.suppress(Exception):
            child.communicate(timeout=30)


class Workers:
    """Two worker processes per system, started once and reused by every measurement."""

    def __init__(self) -> None:
        self._pools: dict[str, list[subprocess.Popen[str]]] = {}

    def get(self, system: str) -> list[subprocess.Popen[str]]:
        if system not in self._pools:
            children = [spawn(system, GC_SETTING[0]) for _ in range(WORKERS)]
            self._pools[system] = children
            for child in children:
                expect_ready(child)
        return self._pools[system]

    def close(self) -> None:
        for children in self._pools.values():
            for child in children:
                with contextlib.suppress(OSError):
                    assert child.stdin is not None
                    child.stdin.close()  # EOF: the process ends
            for child in children:
                try:
                    child.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
        self._pools.clear()


WORKER_POOL = Workers()
GC_SETTING = ["worker"]
"""The wakeful worker processes' garbage collector settings (``--gc``): as ``wakeful worker``
runs by default, unless told ``python``."""


def drain(
    system: str, target: str, concurrency: int, n: int, cost: ServerCost | None = None
) -> float:
    """Two worker processes drain ``n`` queued jobs; returns jobs per second. With ``cost``,
    the server's transactions and CPU from ``go`` to the last result (``pgcost``), and the
    worker processes' CPU over the same span (``cost.clients``)."""
    children = WORKER_POOL.get(system)

    # A drain that hangs is killed: the reads below then fail instead of waiting forever.
    def kill_all() -> None:
        for child in children:
            child.kill()

    watchdog = threading.Timer(CHILD_TIMEOUT, kill_all)
    watchdog.start()
    clients = ProcessCpu([child.pid for child in children])
    try:
        for child in children:
            send(child, f"prepare {target} {concurrency}")
        for child in children:
            expect_ready(child)
        with cost if cost is not None else contextlib.nullcontext():
            clients.start()
            go = time.monotonic()
            for child in children:
                send(child, "go")
            results = [collect(child) for child in children]
            clients.stop()
    finally:
        watchdog.cancel()
    if cost is not None:
        cost.clients = clients.seconds
    executed = sum(int(r["executed"]) for r in results)
    done = sum(int(r["done"]) for r in results)
    if executed != n or done != n:
        raise RuntimeError(
            f"{system} c={concurrency}: {executed} executions, {done} finished, {n} jobs: {results}"
        )
    return n / (max(float(r["end"]) for r in results) - go)


async def submit_all(url: str, n: int) -> None:
    async with open_store(url) as store:
        sem = asyncio.Semaphore(32)

        async def one(i: int) -> None:
            async with sem:
                await submit(store, f"t{i}", "noop", {}, dispatch_id=f"d{i}")

        await asyncio.gather(*(one(i) for i in range(n)))


async def verify_wakeful(url: str, n: int) -> None:
    async with open_store(url) as store:
        done = 0
        after: str | None = None
        while batch := await store.list_dispatches(status="done", after=after, limit=1000):
            done += len(batch)
            after = batch[-1].dispatch_id
        if done != n:
            raise RuntimeError(f"wakeful: {done} of {n} dispatches settled done")
        for i in random.Random(n).sample(range(n), min(n, 20)):
            snap = await store.read(f"t{i}")
            status = snap.checkpoint.status if snap and snap.checkpoint else None
            if status != "completed" or snap is None or snap.claim is not None:
                raise RuntimeError(f"wakeful: thread t{i} ended {status!r}")


def wakeful_sqlite(directory: Path, concurrency: int, n: int) -> float:
    path = directory / f"dispatch-{concurrency}.db"
    url = f"sqlite:///{path}"
    asyncio.run(submit_all(url, n))
    try:
        rate = drain("wakeful", url, concurrency, n)
        asyncio.run(verify_wakeful(url, n))
        return rate
    finally:
        for leftover in directory.glob(f"{path.name}*"):
            leftover.unlink()


PER_JOB: dict[tuple[str, int, str], list[float]] = {}
"""(system, C, what) -> per job, one per round: PostgreSQL transactions (the database's
``xact_commit + xact_rollback``), server CPU (its backends) and worker processes' CPU."""


def counted_drain(db: Database, system: str, label: str, concurrency: int, n: int) -> float:
    cost = ServerCost(db.admin_dsn, db.name)
    rate = drain(system, db.dsn, concurrency, n, cost)
    record_cost(PER_JOB, (label, concurrency), cost, n)
    return rate


def wakeful_postgres(db: Database, concurrency: int, n: int) -> float:
    db.create()
    try:
        asyncio.run(submit_all(db.dsn, n))
        rate = counted_drain(db, "wakeful", "wakeful postgres", concurrency, n)
        asyncio.run(verify_wakeful(db.dsn, n))
        return rate
    finally:
        db.drop()


async def _pgqueuer_setup(dsn: str, n: int) -> None:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
    finally:
        await conn.close()


def pgqueuer_rate(db: Database, concurrency: int, n: int) -> float:
    db.create()
    try:
        asyncio.run(_pgqueuer_setup(db.dsn, n))
        rate = counted_drain(db, "pgqueuer", "pgqueuer", concurrency, n)
        with psycopg.connect(db.dsn) as conn:
            left = conn.execute("SELECT count(*) FROM pgqueuer").fetchone()
            ok = conn.execute(
                "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
            ).fetchone()
        if left is None or ok is None or left[0] != 0 or ok[0] != n:
            raise RuntimeError(f"pgqueuer: {left} jobs left, {ok} logged successful of {n}")
        return rate
    finally:
        db.drop()


async def _procrastinate_setup(dsn: str, n: int) -> None:
    procrastinate = _procrastinate()

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    async def noop() -> None:
        pass

    task = app.task(name="noop")(noop)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        await task.batch_defer_async(*({} for _ in range(n)))


def procrastinate_rate(db: Database, concurrency: int, n: int) -> float:
    db.create()
    try:
        asyncio.run(_procrastinate_setup(db.dsn, n))
        rate = counted_drain(db, "procrastinate", "procrastinate", concurrency, n)
        with psycopg.connect(db.dsn) as conn:
            rows = conn.execute(
                "SELECT status::text, count(*) FROM procrastinate_jobs GROUP BY 1"
            ).fetchall()
        if dict(rows) != {"succeeded": n}:
            raise RuntimeError(f"procrastinate: jobs by status {dict(rows)}, expected {n}")
        return rate
    finally:
        db.drop()


# ------------------------------------------------------------------ recovery


def wait_until(check: Callable[[], Any], what: str, deadline: float = 60.0) -> Any:
    end = time.monotonic() + deadline
    while not (found := check()):
        if time.monotonic() > end:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.002)
    return found


async def _thread_outcome(url: str, thread_id: str) -> tuple[str | None, list[str]]:
    async with open_store(url) as store:
        snap = await store.read(thread_id)
        events = [e.type for e in await store.events_after(thread_id, 0, 1000)]
        return (snap.checkpoint.status if snap and snap.checkpoint else None), events


def recovery_trial(
    url: str, directory: Path, trial: int, rng: random.Random, workers: list[int]
) -> tuple[float, int]:
    """SIGKILL the worker (one of the ``workers`` pids) running a long node: seconds until
    another process re-enters the node, and the pid killed."""
    thread_id = f"k{trial}"

    async def enqueue() -> None:
        async with open_store(url) as store:
            await submit(store, thread_id, "slow", {"n": trial}, dispatch_id=f"kd{trial}")

    asyncio.run(enqueue())
    first = wait_until(lambda: list(directory.glob(f"enter-{trial}-*")), "the long node to start")
    victim = int(first[0].name.rsplit("-", 1)[1])
    if victim not in workers:
        raise RuntimeError(f"node entered by an unknown process {victim}")
    time.sleep(rng.uniform(0.2, 1.0))
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)

    def resumed() -> list[Path]:
        return [p for p in directory.glob(f"enter-{trial}-*") if p != first[0]]

    again = wait_until(resumed, "the run to resume in the other worker", 30.0)
    latency = float(again[0].read_text()) - killed

    def finished() -> bool:
        return asyncio.run(_thread_outcome(url, thread_id))[0] == "completed"

    wait_until(finished, "the recovered run to complete", 30.0)
    _, events = asyncio.run(_thread_outcome(url, thread_id))
    if events.count("run.recovered") != 1 or events.count("run.completed") != 1:
        raise RuntimeError(f"recovery trial {trial}: events {events}")
    return latency, victim


def recovery(url: str, directory: Path, trials: int) -> list[float]:
    """``trials`` kills; the survivor of each serves the next, beside a fresh process."""
    rng = random.Random(11)
    alive: list[subprocess.Popen[str]] = []
    latencies = []
    spawned = 0
    try:
        for trial in range(trials):
            fresh = []
            while len(alive) < WORKERS:
                fresh.append(spawn("recovery", url, str(directory), f"w{spawned}"))
                alive.append(fresh[-1])
                spawned += 1
            for child in fresh:
                expect_ready(child)
            latency, victim = recovery_trial(url, directory, trial, rng, [c.pid for c in alive])
            latencies.append(latency)
            reap([c for c in alive if c.pid == victim])
            alive = [c for c in alive if c.pid != victim]
    finally:
        for child in alive:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)  # graceful: its stats line, then exit
        for child in alive:
            try:
                child.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                reap([child])
    return latencies


# ------------------------------------------------------------------ main


def _installed(module: str) -> str | None:
    try:
        __import__(module)
    except ImportError as exc:
        return f"{module} is not installed ({exc.name}); pip install 'wakeful[bench]'"
    return None


def run(args: argparse.Namespace) -> list[Result]:
    missing = {name: _installed(name) for name in ("pgqueuer", "procrastinate", "asyncpg")}
    pgq_missing = missing["pgqueuer"] or missing["asyncpg"]
    proc_missing = missing["procrastinate"]
    pid = os.getpid()
    dbs = {
        key: Database(args.dsn, f"wakeful_bench_{key}_{pid}")
        for key in ("wakeful", "pgqueuer", "procrastinate", "recovery")
    }
    samples: dict[tuple[str, int], list[float]] = {}
    kills: dict[str, list[float]] = {}
    directory = Path(tempfile.mkdtemp(prefix="wakeful-bench-dispatch-"))
    measures: dict[str, Callable[[int, int], float]] = {
        "wakeful sqlite": lambda c, n: wakeful_sqlite(directory, c, n),
        "wakeful postgres": lambda c, n: wakeful_postgres(dbs["wakeful"], c, n),
    }
    if pgq_missing is None:
        measures["pgqueuer"] = lambda c, n: pgqueuer_rate(dbs["pgqueuer"], c, n)
    if proc_missing is None:
        measures["procrastinate"] = lambda c, n: procrastinate_rate(dbs["procrastinate"], c, n)
    try:
        for _ in range(args.rounds):
            for concurrency in CONCURRENCIES:
                n = args.n if concurrency > 1 else args.n_single
                for system, measure in measures.items():
                    rate = measure(concurrency, n)
                    samples.setdefault((system, concurrency), []).append(rate)
        if args.kill_trials:
            kill_dir = directory / "sqlite-kill"
            kill_dir.mkdir()
            kills["sqlite"] = recovery(
                f"sqlite:///{directory / 'kill.db'}", kill_dir, args.kill_trials
            )
            pg_dir = directory / "postgres-kill"
            pg_dir.mkdir()
            dbs["recovery"].create()

            async def migrate() -> None:
                async with open_store(dbs["recovery"].dsn):
                    pass

            asyncio.run(migrate())
            kills["postgres"] = recovery(dbs["recovery"].dsn, pg_dir, args.kill_trials)
    finally:
        WORKER_POOL.close()
        shutil.rmtree(directory, ignore_errors=True)
        for db in dbs.values():
            db.drop()
    return report(args, samples, kills, pgq_missing, proc_missing)


def report(
    args: argparse.Namespace,
    samples: dict[tuple[str, int], list[float]],
    kills: dict[str, list[float]],
    pgq_missing: str | None,
    proc_missing: str | None,
) -> list[Result]:
    out = Collector("dispatch")
    for concurrency in CONCURRENCIES:
        pgq = samples.get(("pgqueuer", concurrency))
        proc = samples.get(("procrastinate", concurrency))
        for store in ("sqlite", "postgres"):
            ours = samples[(f"wakeful {store}", concurrency)]
            name = f"wakeful {store}, {WORKERS} processes x {concurrency} runs"
            if store == "postgres":
                targeted = concurrency == 10
                out.add(
                    name + " vs pgqueuer",
                    ours,
                    "dispatches/s",
                    anchor=f"pgqueuer, {WORKERS} processes x {concurrency}",
                    anchor_samples=pgq,
                    target=0.6 if targeted else None,
                    skipped=pgq_missing,
                )
                out.add(
                    name + " vs procrastinate",
                    ours,
                    "dispatches/s",
                    anchor=f"procrastinate, {WORKERS} processes x {concurrency}",
                    anchor_samples=proc,
                    target=4.0 if targeted else None,
                    skipped=proc_missing,
                )
            else:
                out.add(name, ours, "dispatches/s")
    add_costs(out, PER_JOB, ["wakeful postgres", "pgqueuer", "procrastinate"], 10, WORKERS,
              "wakeful postgres")  # fmt: skip
    for store, latencies in kills.items():
        out.add(
            f"SIGKILL -> resumed in another process ({store}, ttl {KILL_TTL:g} s)",
            latencies,
            "s",
            higher_is_better=False,
            anchor="ttl + 0.5 s",
            anchor_samples=KILL_TTL + 0.5,
            target=1.0,
            note=f"renew_every {KILL_RENEW:g} s, poll_interval {KILL_POLL:g} s",
        )
    print(
        f"dispatch: {args.n} no-op dispatches per measurement ({args.n_single} at 1 per "
        f"worker), {WORKERS} worker processes, {args.rounds} rounds (medians, dispatches/s)"
    )
    header = f"{'system':<20}" + "".join(f"{f'{c} per worker':>16}" for c in CONCURRENCIES)
    print(header)
    for system in SYSTEMS:
        cells = []
        for c in CONCURRENCIES:
            values = samples.get((system, c))
            cells.append(f"{statistics.median(values):>16,.0f}" if values else f"{'skipped':>16}")
        print(f"{system:<20}" + "".join(cells))
    print_costs(PER_JOB)
    for result in out.results:
        if result.ratio is not None and "vs" in result.name:
            print(f"  {result.name}: {result.ratio:.2f}x {result.verdict}".rstrip())
    for store, latencies in kills.items():
        each = ", ".join(f"{v:.2f}" for v in latencies)
        print(f"SIGKILL -> resumed elsewhere ({store}, ttl {KILL_TTL:g} s): median "
              f"{statistics.median(latencies):.2f} s (trials: {each}; target <= "
              f"{KILL_TTL + 0.5:g} s)")  # fmt: skip
    for reason in (pgq_missing, proc_missing):
        if reason:
            print(f"skipped: {reason}")
    return out.results


def main(argv: list[str] | None = None) -> list[Result]:
    argv = list(argv if argv is not None else [])
    if argv[:1] == ["--child"]:
        child_main(argv[1:])
        return []
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dispatch")
    parser.add_argument("--n", type=int, default=2000, help="dispatches per measurement")
    parser.add_argument(
        "--n-single", type=int, default=500, help="dispatches per measurement at 1 per worker"
    )
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="server to benchmark (admin DSN)")
    parser.add_argument("--kill-trials", type=int, default=3, help="SIGKILL trials per store")
    parser.add_argument(
        "--gc",
        default="worker",
        help="wakeful worker processes' collector settings, as `wakeful worker --gc` takes: "
        "worker (its default), python, or three thresholds",
    )
    rounds_argument(parser)
    args = parser.parse_args(argv)
    gctune.parse(args.gc)  # refused here, not in the worker processes
    GC_SETTING[0] = args.gc
    return run(args)


if __name__ == "__main__":
    main(sys.argv[1:])
