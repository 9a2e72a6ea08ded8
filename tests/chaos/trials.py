"""One trial per call: provision a store, run children, inject the fault, check.

Every decision of a trial (workload, fault point, delays, cut offsets) comes from
``random.Random(seed)``; process timing does not, so a replayed seed repeats the same fault
plan against the same workload."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import shutil
import signal
import sqlite3
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from tests.chaos import checks, ledger
from tests.chaos.checks import Violation
from tests.chaos.harness import Child, Dump, Stores, read_dump, store_options, wait_until
from tests.private_pg import PrivateServer, start_private_server
from wakeful import open_store
from wakeful.errors import CorruptStore, StoreUnavailable
from wakeful.fleet import RELAY_THREAD, submit
from wakeful.records import Commit, OutboxEntry
from wakeful.store.file.root import COMPACTION_STEPS

TTL = 1.0
WORKER_POINTS = (
    "commit.before",
    "commit.after",
    "settle.before",
    "settle.after",
    "claim_next.after",
    "model.stream",
)
LOG_POINTS = ("log.after_write", "log.after_fsync")


@dataclass
class Trial:
    kind: str
    store: str
    seed: int
    directory: Path
    url: str = ""
    rng: random.Random = field(init=False)
    violations: list[Violation] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    children: list[Child] = field(default_factory=list)
    server: PrivateServer | None = None

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def spawn(self, mode: str, cfg: dict[str, Any]) -> Child:
        cfg = {"seed": self.rng.randrange(2**31), **cfg}
        child = Child(mode, self.url, self.directory, cfg)
        self.children.append(child)
        return child

    def fail(self, invariant: str, detail: str) -> None:
        self.violations.append(Violation(invariant, detail))

    def wait_up(self, child: Child) -> bool:
        if wait_until(lambda: child.up() or not child.alive(), 60):
            return child.up() or self.died(child)
        self.fail("harness", f"{child.name} did not start: {child.tail()}")
        return False

    def died(self, child: Child) -> bool:
        """A child that exited before starting: fine if it was killed by its own fault."""
        if child.proc.returncode == -signal.SIGKILL and self.fault_records():
            return False
        self.fail("harness", f"{child.name} exited with {child.proc.returncode}: {child.tail()}")
        return False

    def fault_records(self) -> list[dict[str, Any]]:
        return ledger.read(self.directory / "faults.jsonl")

    def cleanup(self) -> None:
        for child in self.children:
            if child.alive():
                child.send(signal.SIGCONT)
                child.kill()
            elif child.proc.returncode is None:
                child.proc.wait()


@dataclass
class TrialResult:
    kind: str
    store: str
    seed: int
    duration: float
    violations: list[Violation]
    notes: dict[str, Any]
    directory: str


def run_trial(kind: str, store: str, seed: int, stores: Stores, base: Path) -> TrialResult:
    directory = base / f"{kind}-{store}-{seed}"
    directory.mkdir(parents=True, exist_ok=True)
    trial = Trial(kind, store, seed, directory)
    started = time.monotonic()
    try:
        if kind == "pg_restart":  # its own server: a restart of the shared one cuts its users
            trial.server = start_private_server()
            trial.url = trial.server.url
        else:
            trial.url = stores.create(store, directory)
        DRIVERS[kind](trial)
    except Exception:
        trial.fail("harness", traceback.format_exc(limit=8))
    finally:
        trial.cleanup()
        if trial.url and trial.violations:
            keep_evidence(trial)
        if trial.server is not None:
            trial.server.node.remove()
        elif trial.url:
            try:
                stores.dispose(trial.url)
            except Exception as exc:  # a leftover database is not a trial failure
                trial.notes["dispose_error"] = repr(exc)
    duration = time.monotonic() - started
    if not trial.violations:
        shutil.rmtree(directory, ignore_errors=True)
    return TrialResult(kind, store, seed, duration, trial.violations, trial.notes, str(directory))


def keep_evidence(trial: Trial) -> None:
    """Write what the store holds next to the ledgers (a PostgreSQL database is dropped)."""
    try:
        dump = asyncio.run(read_dump(trial.url))
    except Exception as exc:
        trial.notes["evidence"] = f"could not dump the store: {exc!r}"
        return
    (trial.directory / "store-dump.json").write_bytes(
        msgspec.json.format(msgspec.json.encode(dump), indent=1)
    )


# ---------------------------------------------------------------- workload


def agent_plan(rng: random.Random, thread: str) -> dict[str, Any]:
    turns = []
    for _ in range(rng.randint(1, 3)):
        calls = []
        for _ in range(rng.randint(1, 3)):
            bad = rng.choice(["type", "extra", "cut", "unknown"]) if rng.random() < 0.15 else None
            calls.append(
                {
                    "tool": rng.choice(["safe", "keyed", "never"]),
                    "n": rng.randint(0, 999),
                    "bad": bad,
                }
            )
        drop = rng.random() < 0.25
        preface = "Let me look. " if rng.random() < 0.3 else ""
        turns.append({"calls": calls, "drop": drop, "preface": preface})
    return {"thread": thread, "turns": turns, "final": "All done. " * rng.randint(1, 8)}


@dataclass
class Workload:
    agents: dict[str, dict[str, Any]] = field(default_factory=dict)
    pipelines: dict[str, int] = field(default_factory=dict)
    inbox: str = "inbox-0"
    attempts: dict[str, int] = field(default_factory=dict)
    """``max_attempts`` per thread: mostly 20, sometimes 1 (a redelivery is then exhausted
    and its run ends ``indeterminate``)."""

    @property
    def threads(self) -> list[str]:
        inbox = [self.inbox] if self.pipelines else []
        return [*self.agents, *self.pipelines, *inbox]


def make_workload(rng: random.Random, scale: int = 1) -> Workload:
    work = Workload()
    for i in range(rng.randint(1, 3) * scale):
        work.agents[f"agent-{i}"] = agent_plan(rng, f"agent-{i}")
    for i in range(rng.randint(scale - 1, 2)):
        work.pipelines[f"pipe-{i}"] = rng.randint(2, 3)
    exhaustion = os.environ.get("CHAOS_EXHAUSTION", "1") != "0"
    for thread in [*work.agents, *work.pipelines]:
        work.attempts[thread] = 1 if rng.random() < 0.15 and exhaustion else 20
    return work


async def submit_workload(url: str, work: Workload, acks: Path) -> None:
    """Submit every dispatch (idempotent by dispatch id: retried while the store is
    unavailable, e.g. PostgreSQL restarted by another user of the server)."""
    requests: list[tuple[str, str, Any]] = [
        (thread, "agent", {"chaos": plan}) for thread, plan in work.agents.items()
    ]
    requests += [
        (thread, "pipeline", {"log": [], "inbox": work.inbox, "width": width})
        for thread, width in work.pipelines.items()
    ]
    deadline = time.monotonic() + 90
    while True:
        try:
            async with open_store(url, **store_options(url)) as store:
                for thread, target, graph_input in requests:
                    d = await submit(
                        store,
                        thread,
                        target,
                        graph_input,
                        dispatch_id=f"d-{thread}",
                        max_attempts=work.attempts[thread],
                    )
                    ledger.append(acks, {"op": "enqueue", "dispatch": d.dispatch_id, "pid": 0})
            return
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


def worker_fault(t: Trial, work: Workload, action: str) -> dict[str, Any]:
    """The fault of the first worker: at a random moment, or at an instrumented point."""
    rng = t.rng
    if rng.random() < 0.4:
        return {"mode": "delay", "delay": rng.uniform(0.05, 1.2), "action": action}
    kinds = sorted(
        {
            c["tool"]
            for p in work.agents.values()
            for turn in p["turns"]
            for c in turn["calls"]
            if not c.get("bad")
        }
    )
    choices: list[tuple[str, str, int]] = [(p, "", 3) for p in WORKER_POINTS]
    choices += [(p, k, 2) for k in kinds for p in ("tool.before_effect", "tool.after_effect")]
    if work.pipelines:
        choices += [("node.work", "", 3), ("relay.after", "", 2)]
    if t.store == "file" and action == "kill":
        choices += [(f"crash:{p}", "", 1) for p in (*LOG_POINTS, *COMPACTION_STEPS)]
    point, match, most = rng.choice(choices)
    nth = rng.randint(1, most * (10 if point == "model.stream" else 1))
    return {"mode": "point", "point": point, "match": match, "nth": nth, "action": action}


def worker_cfg(t: Trial, name: str, fault: dict[str, Any] | None) -> dict[str, Any]:
    cfg: dict[str, Any] = {"name": name, "ttl": TTL, "drain": True}
    if t.store == "file":
        cfg["compact_bytes"] = t.rng.choice([None, 6000, 20000])
    if fault is None or fault["mode"] == "delay":
        return cfg
    point = str(fault["point"])
    if point.startswith("crash:"):
        cfg["crash_at"] = point.removeprefix("crash:")
        if cfg["crash_at"] in LOG_POINTS:
            cfg["crash_after"] = t.rng.uniform(0.05, 1.5)
        else:
            cfg["compact_bytes"] = t.rng.randint(3000, 9000)
    else:
        cfg["fault"] = {k: fault[k] for k in ("point", "match", "nth", "action")}
    return cfg


def apply_fault(
    t: Trial, child: Child, fault: dict[str, Any], tick: Callable[[], None] = lambda: None
) -> None:
    """Wait for the fault to happen to ``child`` (or inflict it after the delay), calling
    ``tick`` while waiting."""
    t.notes["fault"] = describe(fault)
    t.notes["points"] = [category(fault)]

    def gone() -> bool:
        tick()
        return not child.alive() or (fault["action"] == "stop" and child.stopped())

    if fault["mode"] == "delay":
        wait_until(gone, fault["delay"])
        t.notes["hit"] = child.alive()
        if child.alive():
            if fault["action"] == "stop":
                child.send(signal.SIGSTOP)
                wait_until(child.stopped, 10)
            else:
                child.kill()
        return
    wait_until(gone, 60)
    if fault["action"] == "stop":
        t.notes["hit"] = child.stopped()
    else:
        t.notes["hit"] = child.proc.returncode == -signal.SIGKILL
    if child.alive() and not child.stopped():
        t.fail("liveness", f"{child.name} neither reached its fault nor finished")


def describe(fault: dict[str, Any]) -> str:
    if fault["mode"] == "delay":
        return f"{fault['action']} after {fault['delay']:.2f}s"
    match = f":{fault['match']}" if fault.get("match") else ""
    return f"{fault['action']} at {fault['point']}{match}#{fault['nth']}"


def category(fault: dict[str, Any]) -> str:
    """The fault without its random numbers, for the figures."""
    if fault["mode"] == "delay":
        return f"{fault['action']} after a random delay"
    match = f" ({fault['match']})" if fault.get("match") else ""
    return f"{fault['action']} at {fault['point']}{match}"


def sqlite_locked(url: str) -> bool:
    """Whether another process holds the SQLite database's write lock."""
    connection = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=0.2, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError:
        return True
    finally:
        connection.close()


def held_lock(url: str, alone: bool) -> bool:
    """Whether the (stopped) first worker holds the SQLite write lock: the lock is taken now
    and, unless nobody else is running, still taken a moment later."""
    if not sqlite_locked(url):
        return False
    return alone or all(sqlite_locked(url) for _ in range(3))


LOCKED_OUT = "stayed locked by another connection"


def finish_all(t: Trial, children: list[Child], deadline: float) -> bool:
    """Wait for the children to exit by themselves (workers drain, then stop). One that is
    still running at the deadline is a liveness failure (it is then terminated); one that
    failed is a harness failure, except a worker that could not open a SQLite store because
    a paused worker held its write lock (opening takes it): counted as ``locked_out``."""
    end = time.monotonic() + deadline
    ok = True
    for child in children:
        if not child.wait(max(0.1, end - time.monotonic())):
            child.finish(0)
            t.fail("liveness", f"{child.name} did not finish within {deadline:.0f} s")
            ok = False
        elif child.proc.returncode != 0:
            ok = False
            if child.proc.returncode == 1 and LOCKED_OUT in child.tail(4000):
                t.notes["locked_out"] = t.notes.get("locked_out", 0) + 1
            else:
                t.fail("harness", f"{child.name} exited {child.proc.returncode}: {child.tail()}")
    return ok


def drain(t: Trial, work: Workload, children: list[Child]) -> None:
    """Let every child finish; if some were locked out of the store, a fresh worker drains
    what they left. Then check."""
    locked = t.notes.get("locked_out", 0)
    finish_all(t, children, 90)
    if t.notes.get("locked_out", 0) > locked:
        finish_all(t, [t.spawn("worker", worker_cfg(t, "w9", None))], 90)
    check_workers(t, work, asyncio.run(read_dump(t.url, tuple(work.threads))))


def check_workers(t: Trial, work: Workload, dump: Dump) -> None:
    acks = ledger.read_all(t.directory, "acks-")
    effects = ledger.read_all(t.directory, "effects-")
    found = checks.acknowledged(dump, acks) + checks.stale(acks) + checks.token_order(dump)
    found += checks.events_unique(dump) + checks.no_rerun(acks, effects)
    found += checks.keys_distinct(effects)
    for thread, plan in work.agents.items():
        found += checks.conversation(dump.thread(thread), 8)
        found += checks.tool_calls(dump.thread(thread), plan, effects)
    staged = {(tgt, mid) for a in checks.ops(acks, "commit") for tgt, mid in a["outbox"]}
    found += checks.delivered(dump, staged, consumed=True)
    found += checks.received(dump, {work.inbox} if work.pipelines else set())
    exhaustible = {thread for thread, n in work.attempts.items() if n == 1}
    # The inbox thread has work only if a message was staged (an exhausted pipeline may
    # end before its tasks send anything).
    threads = [t for t in work.threads if t != work.inbox or any(s[0] == t for s in staged)]
    found += checks.finished(dump, threads, exhaustible)
    t.violations += found
    recoveries: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    for thread in work.agents:
        for m in dump.thread(thread).messages:
            recoveries.update(m.metadata.get("recoveries") or [])
            if m.role == "tool":
                outcomes[str(m.metadata.get("outcome"))] += 1
    t.notes["recoveries"] = dict(recoveries)
    t.notes["outcomes"] = dict(outcomes)
    t.notes["takeovers"] = redeliveries(acks)
    t.notes["stale_refusals"] = sum(
        s.get("fenced", 0) for s in ledger.read_all(t.directory, "stats-")
    )


def redeliveries(acks: list[dict[str, Any]]) -> int:
    """Leases granted again while the previous lease of the dispatch was never settled (its
    holder died, stalled or was fenced)."""
    timeline: dict[str, list[tuple[float, str]]] = {}
    for a in checks.ops(acks, "grant", "settle"):
        if "dispatch" in a:
            timeline.setdefault(a["dispatch"], []).append((a["t1"], a["op"]))
    count = 0
    for items in timeline.values():
        open_lease = False
        for _, op in sorted(items):
            if op == "grant":
                count += open_lease
                open_lease = True
            else:
                open_lease = False
    return count


# ---------------------------------------------------------------- worker kill / stop


def worker_trial(t: Trial, action: str) -> None:
    """The first worker gets the fault; a second one (not on the file store) joins at a
    random moment; replacements drain the queue. Sometimes a replacement is killed too. A
    stopped worker is woken either after its successors finished (then the store must be
    unchanged by it) or while they still run (a stale and a live owner side by side)."""
    work = make_workload(t.rng)
    asyncio.run(submit_workload(t.url, work, t.directory / "acks-parent.jsonl"))
    fault = worker_fault(t, work, action)
    first = t.spawn("worker", worker_cfg(t, "w1", fault))
    others: list[Child] = []
    if not t.wait_up(first) and not t.fault_records():
        return
    join_at = time.monotonic() + t.rng.uniform(0.0, 0.6)

    def join() -> None:
        if t.store != "file" and not others and time.monotonic() >= join_at:
            others.append(t.spawn("worker", worker_cfg(t, "w2", None)))

    apply_fault(t, first, fault, join)
    if t.store == "file" and first.alive():
        return  # a stalled single worker: reported by apply_fault
    join_at = 0.0
    join()
    others.append(t.spawn("worker", worker_cfg(t, "w3", None)))
    if t.rng.random() < 0.3:  # a second fault: a replacement dies too
        victim = t.rng.choice(others)
        delay = t.rng.uniform(0.1, 1.0)
        t.notes["second"] = f"kill {victim.name} after {delay:.2f}s"
        wait_until(lambda: not victim.alive(), delay)
        victim.kill()
        others.append(t.spawn("worker", worker_cfg(t, "w4", None)))
    others = [c for c in others if c.alive() or c.proc.returncode != -signal.SIGKILL]
    if action == "kill":
        drain(t, work, others + ([first] if first.alive() else []))
        return
    paused = first.stopped()
    if paused and t.rng.random() < 0.5:
        awake = TTL + t.rng.uniform(0.0, 1.0)
        t.notes["wake"] = f"SIGCONT {awake:.2f}s after the stop, successors running"
        wait_until(lambda: all(not c.alive() for c in others), awake)
        first.send(signal.SIGCONT)
        drain(t, work, [*others, first])
        return

    def successors_done() -> bool:
        return all(not c.alive() for c in others)

    done = wait_until(successors_done, 15)
    if t.store == "sqlite" and paused and held_lock(t.url, done):
        # Stopped inside a write transaction: nobody can write (nor open the store) until
        # it runs again. Liveness, counted apart; safety is still checked.
        t.notes["stalled"] = "the paused worker holds the SQLite write lock"
        first.send(signal.SIGCONT)
        drain(t, work, [*others, first])
        return
    if not done and not wait_until(successors_done, 45):
        t.fail("liveness", "the successors did not finish while the first worker was paused")
        first.send(signal.SIGCONT)
        drain(t, work, [*others, first])
        return
    finish_all(t, others, 10)
    before = asyncio.run(read_dump(t.url, tuple(work.threads)))
    t.notes["wake"] = "SIGCONT after the successors finished"
    first.send(signal.SIGCONT)
    finish_all(t, [first], 60)
    after = asyncio.run(read_dump(t.url, tuple(work.threads)))
    if paused:
        t.violations += checks.unchanged(before, after, skip=(RELAY_THREAD,))
    check_workers(t, work, after)


def worker_kill(t: Trial) -> None:
    worker_trial(t, "kill")


def worker_stop(t: Trial) -> None:
    worker_trial(t, "stop")


def pg_restart(t: Trial) -> None:
    work = make_workload(t.rng, scale=2)
    asyncio.run(submit_workload(t.url, work, t.directory / "acks-parent.jsonl"))
    workers = [t.spawn("worker", worker_cfg(t, f"w{i}", None)) for i in (1, 2)]
    for w in workers:
        if not t.wait_up(w):
            return
    delay = t.rng.uniform(0.05, 0.8)
    t.notes["fault"] = f"restart after {delay:.2f}s"
    t.notes["points"] = ["restart after a random delay"]
    time.sleep(delay)  # the random moment of the restart (fault injection, not a check)
    t.notes["hit"] = all(w.alive() for w in workers)
    assert t.server is not None, "a pg_restart trial runs on its own server"
    t.server.restart()
    finish_all(t, workers, 120)
    check_workers(t, work, asyncio.run(read_dump(t.url, tuple(work.threads))))


# ---------------------------------------------------------------- relay kill


async def stage(url: str, rng: random.Random, acks: Path) -> None:
    targets = [f"tgt-{i}" for i in range(rng.randint(1, 3))]
    async with open_store(url, **store_options(url)) as store:
        for s in range(rng.randint(2, 4)):
            source = f"src-{s}"
            claim = await store.claim(source, "stager", 60)
            for c in range(rng.randint(1, 3)):
                entries = tuple(
                    OutboxEntry(
                        message_id=f"m-{s}-{c}-{j}",
                        target_thread=rng.choice(targets),
                        payload={"s": s, "c": c, "j": j},
                    )
                    for j in range(rng.randint(1, 8))
                )
                await store.commit(source, Commit(token=claim.token, outbox=entries))
                ledger.append(
                    acks,
                    {"op": "stage", "outbox": [[e.target_thread, e.message_id] for e in entries]},
                )
            await store.release(source, claim.token)


def relay_fault(t: Trial) -> dict[str, Any]:
    rng = t.rng
    roll = rng.random()
    if roll < 0.45:
        return {"mode": "delay", "delay": rng.uniform(0.02, 0.6), "action": "kill"}
    if t.store == "file" and roll < 0.75:
        point = rng.choice(["relay.after_append", *LOG_POINTS])
        return {"mode": "point", "point": f"crash:{point}", "match": "", "nth": 1, "action": "kill"}
    return {
        "mode": "point",
        "point": "relay.after",
        "match": "",
        "nth": rng.randint(1, 4),
        "action": "kill",
    }


def relay_cfg(t: Trial, name: str, fault: dict[str, Any] | None, drain: bool) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "name": name,
        "limit_max": t.rng.randint(1, 4),
        "pause_max": 0.02,
        "drain": drain,
    }
    if fault is not None and fault["mode"] == "point":
        point = str(fault["point"])
        if point.startswith("crash:"):
            cfg["crash_at"] = point.removeprefix("crash:")
            if cfg["crash_at"] in LOG_POINTS:
                cfg["crash_after"] = t.rng.uniform(0.0, 0.3)
        else:
            cfg["fault"] = {k: fault[k] for k in ("point", "match", "nth", "action")}
    return cfg


def relay_kill(t: Trial) -> None:
    acks = t.directory / "acks-parent.jsonl"
    asyncio.run(stage(t.url, t.rng, acks))
    hits = []
    for r in range(t.rng.randint(1, 3)):
        fault = relay_fault(t)
        first = t.spawn("relay", relay_cfg(t, f"r{r}a", fault, drain=False))
        others = (
            [] if t.store == "file" else [t.spawn("relay", relay_cfg(t, f"r{r}b", None, False))]
        )
        if not t.wait_up(first) and not t.fault_records():
            return
        t.notes.setdefault("faults", []).append(describe(fault))
        t.notes.setdefault("points", []).append(category(fault))
        if fault["mode"] == "delay":
            wait_until(lambda: not first.alive(), fault["delay"])  # noqa: B023
            hits.append(first.alive())
        else:
            hits.append(first.wait(1.5))  # relays are quick: a point not reached by then never is
        first.kill()
        for other in others:
            wait_until(lambda: not other.alive(), t.rng.uniform(0.0, 0.3))  # noqa: B023
            other.kill()
    t.notes["hit"] = any(hits)
    drainer = t.spawn("relay", relay_cfg(t, "drain", None, drain=True))
    finish_all(t, [drainer], 60)
    staged = {(tgt, mid) for a in ledger.read(acks) for tgt, mid in a["outbox"]}
    dump, left = asyncio.run(relay_dump(t.url))
    t.violations += checks.delivered(dump, staged, consumed=False) + checks.events_unique(dump)
    if left:
        t.fail("liveness", f"{left} staged entries left after the drain")
    t.notes["messages"] = len(staged)


async def relay_dump(url: str) -> tuple[Dump, int]:
    """The store, and how many staged entries a last relay call still finds."""
    dump = await read_dump(url)
    deadline = time.monotonic() + 90
    while True:
        try:
            async with open_store(url, **store_options(url)) as store:
                return dump, await store.relay_outbox(100)
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


# ---------------------------------------------------------------- writer kill


def writer_fault(t: Trial) -> dict[str, Any]:
    roll = t.rng.random()
    if t.store == "file" and roll < 0.35:
        point = t.rng.choice([*LOG_POINTS, *COMPACTION_STEPS])
        return {"mode": "point", "point": f"crash:{point}", "match": "", "nth": 1, "action": "kill"}
    if roll < 0.6:
        point = t.rng.choice(["commit.before", "commit.after"])
        nth = t.rng.randint(1, 20)
        return {"mode": "point", "point": point, "match": "", "nth": nth, "action": "kill"}
    return {"mode": "delay", "delay": t.rng.uniform(0.1, 1.5), "action": "kill"}


def writer_kill(t: Trial) -> None:
    """Rounds of writer processes (two at once but on the file store), each killed by its
    own fault; the threads carry over from round to round."""
    threads = [f"w-{i}" for i in range(t.rng.randint(2, 4))]
    for r in range(t.rng.randint(1, 3)):
        round_children: list[tuple[Child, dict[str, Any]]] = []
        for j in range(1 if t.store == "file" else 2):
            fault = writer_fault(t)
            t.notes.setdefault("faults", []).append(describe(fault))
            t.notes.setdefault("points", []).append(category(fault))
            cfg: dict[str, Any] = {"name": f"w{r}{j}", "threads": threads, "ttl": 0.3}
            cfg["pause_max"] = 0.6
            if t.store == "file":
                cfg["compact_bytes"] = t.rng.randint(4000, 30000)
            point = str(fault.get("point", ""))
            if point.startswith("crash:"):
                cfg["crash_at"] = point.removeprefix("crash:")
                if cfg["crash_at"] in LOG_POINTS:
                    cfg["crash_after"] = t.rng.uniform(0.05, 1.0)
                else:
                    cfg["compact_bytes"] = t.rng.randint(2000, 6000)
            elif point:
                cfg["fault"] = {k: fault[k] for k in ("point", "match", "nth", "action")}
            round_children.append((t.spawn("writer", cfg), fault))
        for child, _ in round_children:
            t.wait_up(child)
        for child, fault in round_children:
            if fault["mode"] == "delay":
                wait_until(lambda: not child.alive(), fault["delay"])  # noqa: B023
            elif not child.wait(10):
                t.notes["unhit"] = t.notes.get("unhit", 0) + 1
            if child.alive():
                child.kill()
            elif child.proc.returncode != -signal.SIGKILL:
                t.fail("harness", f"{child.name} exited {child.proc.returncode}: {child.tail()}")
    acks = ledger.read_all(t.directory, "acks-")
    dump = asyncio.run(read_dump(t.url, tuple(threads)))
    t.violations += checks.acknowledged(dump, acks) + checks.stale(acks)
    t.violations += checks.token_order(dump) + checks.events_unique(dump)
    t.violations += checks.writer_threads(dump, threads)
    for error in ledger.read_all(t.directory, "errors-"):
        t.fail("harness", f"unexpected store error in a writer: {error}")
    if t.store == "sqlite":
        connection = sqlite3.connect(t.url.removeprefix("sqlite:///"))
        try:
            verdict = connection.execute("PRAGMA integrity_check").fetchone()[0]
        finally:
            connection.close()
        if verdict != "ok":
            t.fail("acknowledged", f"SQLite integrity_check: {verdict}")
    t.notes["commits"] = len(checks.ops(acks, "commit"))
    t.notes["claims"] = len(checks.ops(acks, "grant"))


# ---------------------------------------------------------------- torn and corrupt logs


def build_log(t: Trial) -> tuple[Path, list[dict[str, Any]]]:
    cfg = {
        "name": "builder",
        "threads": [f"t-{i}" for i in range(t.rng.randint(1, 3))],
        "count": t.rng.randint(3, 150),
        "compact_bytes": t.rng.choice([None, 3000, 8000, 30000]),
    }
    builder = t.spawn("builder", cfg)
    if not builder.finish(120):
        raise RuntimeError(f"the builder failed: {builder.tail()}")
    t.notes["commits"] = cfg["count"]
    return t.directory / "root", ledger.read(t.directory / "acks-builder.jsonl")


def torn_log(t: Trial) -> None:
    root, acks = build_log(t)
    log = root / "commits.ndjson"
    data = log.read_bytes()
    header_len = data.index(b"\n") + 1
    generation = int(json.loads(data[:header_len])["m"]["generation"])
    ends = [i + 1 for i, byte in enumerate(data) if byte == 0x0A]
    roll = t.rng.random()
    if roll < 0.4:
        where, cut = "anywhere", t.rng.randint(0, len(data))
    elif roll < 0.7:
        where, cut = "at the end of a record", t.rng.choice(ends)
    elif roll < 0.9:
        where, cut = "one byte before the end of a record", t.rng.choice(ends) - 1
    else:
        where, cut = "inside the header", t.rng.randint(0, header_len)
    t.notes["points"] = [f"cut {where}"]
    os.truncate(log, cut)
    t.notes["fault"] = f"cut at {cut} of {len(data)} (generation {generation})"
    kept_before = set(root.glob("commits.ndjson.torn-*"))
    expected: dict[str, int] = {}
    for a in acks:
        if a["generation"] < generation or a["size"] <= max(cut, header_len):
            expected[a["thread"]] = max(expected.get(a["thread"], 0), a["version"])
    threads = sorted({a["thread"] for a in acks})
    for attempt in ("open", "reopen"):
        got = asyncio.run(versions(root, threads))
        for thread in threads:
            want = expected.get(thread, 0)
            if got[thread] != (want, want, want, want and f"{thread}-cp-{want}"):
                t.fail(
                    "acknowledged",
                    f"{attempt} after the cut at byte {cut}: {thread} is {got[thread]}, "
                    f"acknowledged before the cut: version {want}",
                )
    after = log.read_bytes()
    if not after.endswith(b"\n"):
        t.fail("acknowledged", "the log does not end with a complete record after recovery")
    kept = b"".join(p.read_bytes() for p in set(root.glob("commits.ndjson.torn-*")) - kept_before)
    restored = kept if cut < header_len else after + kept
    if restored != data[:cut]:
        t.fail(
            "acknowledged",
            f"after the cut at byte {cut}, the recovered log and the kept torn bytes "
            f"({len(kept)} bytes) are not the log as it was cut: bytes were destroyed",
        )


async def versions(root: Path, threads: list[str]) -> dict[str, tuple[Any, ...]]:
    async with open_store(root.as_uri()) as store:
        result: dict[str, tuple[Any, ...]] = {}
        for thread in threads:
            snap = await store.read(thread)
            if snap is None or snap.version == 0:
                result[thread] = (0, 0, 0, 0)
            else:
                cp = snap.checkpoint.id if snap.checkpoint else None
                result[thread] = (snap.version, snap.message_count, snap.last_seq, cp)
        return result


def fingerprint(root: Path) -> dict[str, str]:
    """Every file of the root but the lock (whose content is the opener's pid, a courtesy
    for operators rewritten by every opener)."""
    return {
        str(p.relative_to(root)): digest(p)
        for p in sorted(root.rglob("*"))
        if p.name != "wakeful.lock"
    }


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "directory"


def corrupt_log(t: Trial) -> None:
    root, _ = build_log(t)
    snapshot = root / "snapshot.json"
    target = snapshot if snapshot.exists() and t.rng.random() < 0.25 else root / "commits.ndjson"
    data = bytearray(target.read_bytes())
    last = len(data) - 2 if target.name == "commits.ndjson" else len(data) - 1
    offset = t.rng.randint(0, last)  # never the log's final newline: that is a torn append
    line = data[:offset].count(b"\n") + 1
    part = "header" if line == 1 else "state" if target.name == "snapshot.json" else "a record"
    roll = t.rng.random()
    if roll < 0.7:
        old = data[offset]
        data[offset] ^= t.rng.randint(1, 255)
        end, point = offset + 1, f"flip a byte of {part} in {target.name}"
        fault = f"byte {offset} (line {line}) {old:#04x}->{data[offset]:#04x}"
    elif roll < 0.9:
        # NULs up to a complete line (its newline survives): blocks a disk lost, which a
        # torn append cannot explain.
        end, point = (
            t.rng.randint(offset + 1, last + 1),
            f"zero-fill a run of {part} in {target.name}",
        )
        data[offset:end] = bytes(end - offset)
        fault = f"bytes {offset}..{end} (from line {line}) zeroed"
    else:
        offset, end, point = 0, len(data), f"zero-fill the whole {target.name}"
        data[:] = bytes(len(data))
        fault = "every byte zeroed"
    with target.open("r+b") as f:
        f.seek(offset)
        f.write(bytes(data[offset:end]))
        f.flush()
        os.fsync(f.fileno())
    t.notes["fault"] = f"{target.name} {fault}"
    t.notes["points"] = [point]
    before = fingerprint(root)
    outcome = asyncio.run(open_corrupt(root))
    if outcome != "CorruptStore":
        t.fail("fail-closed", f"{t.notes['fault']}: open gave {outcome}, not CorruptStore")
    if fingerprint(root) != before:
        t.fail("fail-closed", f"{t.notes['fault']}: the refused open changed files")


async def open_corrupt(root: Path) -> str:
    try:
        store = await open_store(root.as_uri())
    except CorruptStore:
        return "CorruptStore"
    except Exception as exc:
        return repr(exc)
    await store.close()
    return "a successful open"


def hand_kill(t: Trial) -> None:
    from tests.chaos.handtrial import hand_kill as trial  # it imports this module

    trial(t)


def relay_replace(t: Trial) -> None:
    from tests.chaos.relaytrial import relay_replace as trial  # it imports this module

    trial(t)


def nats_freeze(t: Trial) -> None:
    from tests.chaos.natstrial import nats_freeze as trial  # it imports this module

    trial(t)


DRIVERS: dict[str, Callable[[Trial], None]] = {
    "worker_kill": worker_kill,
    "worker_stop": worker_stop,
    "relay_kill": relay_kill,
    "writer_kill": writer_kill,
    "pg_restart": pg_restart,
    "torn_log": torn_log,
    "corrupt_log": corrupt_log,
    "hand_kill": hand_kill,
    "relay_replace": relay_replace,
    "nats_freeze": nats_freeze,
}
