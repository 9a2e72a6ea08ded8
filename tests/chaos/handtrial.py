"""The ``hand_kill`` trial: agents whose ``keyed`` and ``never`` tools run through a remote
hand, and the hand SIGKILLed (at a random moment or in the middle of its n-th call) and
restarted on the same port after a short (0.05-0.5 s) or long (1-6 s) downtime, once or
twice. The worker is not faulted: every call through the hand must end as the hand's
ledger says (``ok`` with its result, ``indeterminate`` when the hand died mid-call, an
``error`` only for a call that never reached it), and no hand call runs twice."""

from __future__ import annotations

import asyncio
import random
import signal
import sqlite3
import time
from collections import Counter
from typing import Any

from tests.chaos import checks, ledger
from tests.chaos.handwork import HAND_EFFECTS, HAND_LEDGER
from tests.chaos.harness import Child, read_dump, wait_until
from tests.chaos.trials import Trial, Workload, finish_all, submit_workload, worker_cfg

RECOVERY_WINDOW = 15.0
"""The client's window in the trial: longer than the longest downtime (6 s) plus a start."""


def hand_plan(rng: random.Random, thread: str) -> dict[str, Any]:
    turns = [
        {
            "calls": [
                {"tool": rng.choice(["keyed", "never"]), "n": rng.randint(0, 999), "bad": None}
                for _ in range(rng.randint(1, 2))
            ],
            "drop": False,
            "preface": "",
        }
        for _ in range(rng.randint(1, 3))
    ]
    return {"thread": thread, "turns": turns, "final": "Done through the hand."}


def spawn_hand(t: Trial, name: str, port: int) -> Child | None:
    hand = t.spawn("hand", {"name": name, "port": port})
    return hand if t.wait_up(hand) else None


def hand_fault(t: Trial) -> dict[str, Any]:
    down = t.rng.uniform(0.05, 0.5) if t.rng.random() < 0.5 else t.rng.uniform(1.0, 6.0)
    if t.rng.random() < 0.4:
        return {"mode": "delay", "delay": t.rng.uniform(0.1, 2.0), "down": down}
    return {"mode": "call", "nth": t.rng.randint(1, 3), "down": down}


def describe(fault: dict[str, Any]) -> tuple[str, str]:
    """The fault, and its category without the random numbers (for the figures)."""
    down = "short" if fault["down"] < 1 else "long"
    if fault["mode"] == "delay":
        what = f"kill after {fault['delay']:.2f}s, down {fault['down']:.2f}s"
        return what, f"kill after a random delay, {down} downtime"
    what = f"kill mid-call #{fault['nth']}, down {fault['down']:.2f}s"
    return what, f"kill mid-call, {down} downtime"


def read_hand_ledger(t: Trial) -> dict[str, tuple[str, str | None, str | None]]:
    connection = sqlite3.connect(t.directory / HAND_LEDGER)
    try:
        rows = connection.execute("SELECT operation_id, status, result, error FROM operations")
        return {op: (status, result, error) for op, status, result, error in rows}
    finally:
        connection.close()


def hand_kill(t: Trial) -> None:
    work = Workload()
    for i in range(t.rng.randint(2, 4)):
        work.agents[f"agent-{i}"] = hand_plan(t.rng, f"agent-{i}")
        work.attempts[f"agent-{i}"] = 20
    hand = spawn_hand(t, "h0", 0)
    if hand is None:
        return
    port = int((t.directory / "port-h0").read_text())
    asyncio.run(submit_workload(t.url, work, t.directory / "acks-parent.jsonl"))
    cfg = worker_cfg(t, "w1", None)
    cfg.update(hand_url=f"http://127.0.0.1:{port}", recovery_window=RECOVERY_WINDOW)
    worker = t.spawn("worker", cfg)
    if not t.wait_up(worker):
        return
    hits: list[bool] = []

    def started() -> int:
        return len(ledger.read(t.directory / HAND_EFFECTS))

    for r in range(t.rng.randint(1, 2)):
        fault = hand_fault(t)
        what, category = describe(fault)
        t.notes.setdefault("faults", []).append(what)
        t.notes.setdefault("points", []).append(category)
        if fault["mode"] == "delay":
            wait_until(lambda: not worker.alive(), fault["delay"])
        else:
            target = started() + int(fault["nth"])
            wait_until(lambda: started() >= target or not worker.alive(), 60)  # noqa: B023
        hits.append(worker.alive())
        hand.kill()
        time.sleep(fault["down"])  # the fault: the hand is down this long
        hand = spawn_hand(t, f"h{r + 1}", port)
        if hand is None:
            return
    t.notes["hit"] = any(hits)
    finish_all(t, [worker], 90)
    hand.send(signal.SIGTERM)
    if not hand.wait(15):
        t.fail("liveness", "the hand did not stop on SIGTERM")
    dump = asyncio.run(read_dump(t.url, tuple(work.threads)))
    effects = ledger.read(t.directory / HAND_EFFECTS)
    t.violations += checks.hand_calls(dump, work.threads, read_hand_ledger(t), effects)
    t.violations += checks.finished(dump, work.threads) + checks.events_unique(dump)
    for thread in work.agents:
        t.violations += checks.conversation(dump.thread(thread), 8)
    outcomes = Counter(
        str(m.metadata.get("outcome"))
        for thread in work.agents
        for m in dump.thread(thread).messages
        if m.role == "tool"
    )
    t.notes["outcomes"] = dict(outcomes)
