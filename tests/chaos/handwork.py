"""The remote hand in the chaos matrix, child side: the hand service (mode ``hand``) and
the agent whose ``keyed`` and ``never`` tools run through it (a ``worker`` whose config has
``hand_url``).

The hand's tools log every execution to ``hand-effects.jsonl`` (fsynced, with the call's
idempotency key, which the agent's tool passes as an argument) before they sleep for a
random while, so a SIGKILL of the hand often lands in the middle of a call, after the
ledger recorded its start."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.chaos import ledger
from tests.chaos.probe import PID, Faults
from tests.chaos.workload import ChaosModel
from wakeful.agent import Agent, Tool, ToolContext, tool
from wakeful.fleet import Registry
from wakeful.fleet.hand import RemoteHand
from wakeful.fleet.handserver import run_hand

HAND_EFFECTS = "hand-effects.jsonl"
HAND_LEDGER = "hand-ledger.db"


def hand_tools(directory: Path, rng: random.Random) -> dict[str, Callable[..., Any]]:
    def make(kind: str) -> Callable[..., Any]:
        def op(n: int, key: str) -> dict[str, Any]:
            ledger.append(directory / HAND_EFFECTS, {"kind": kind, "key": key, "n": n, "pid": PID})
            time.sleep(rng.uniform(0.05, 0.4))  # the window in which a kill is mid-call
            return {"kind": kind, "n": n}

        return op

    return {"keyed_op": make("keyed"), "never_op": make("never")}


async def hand_main(url: str, directory: Path, cfg: dict[str, Any]) -> None:
    """Serve the hand on ``cfg["port"]`` (0: any) over the trial's ledger until killed."""
    name = str(cfg["name"])

    def ready(host: str, port: int) -> None:
        tmp = directory / f"port-{name}.tmp"
        tmp.write_text(str(port))
        tmp.replace(directory / f"port-{name}")
        (directory / f"up-{name}").write_text(str(PID))

    await run_hand(
        directory / HAND_LEDGER,
        hand_tools(directory, random.Random(int(cfg["seed"]))),
        "127.0.0.1",
        int(cfg.get("port", 0)),
        on_ready=ready,
        log_level="warning",
    )


def through_hand(hand: RemoteHand) -> list[Tool]:
    """The documented tool pattern: the call's ctx gives the hand the key and the policy."""

    @tool(replay="keyed")
    async def keyed_op(n: int, ctx: ToolContext) -> Any:
        """Write through the hand (sent again with the same key if its answer is lost)."""
        return await hand.call("keyed_op", {"n": n, "key": ctx.idempotency_key}, ctx=ctx)

    @tool(replay="never")
    async def never_op(n: int, ctx: ToolContext) -> Any:
        """Write through the hand (never sent again once it may have reached it)."""
        return await hand.call("never_op", {"n": n, "key": ctx.idempotency_key}, ctx=ctx)

    return [keyed_op, never_op]


def hand_registry(faults: Faults, seed: int, cfg: dict[str, Any]) -> Registry:
    rng = random.Random(seed)
    hand = RemoteHand(str(cfg["hand_url"]), recovery_window=float(cfg["recovery_window"]))
    agent = Agent(
        "chaos",
        ChaosModel(faults, delay=rng.uniform(0.002, 0.01)),
        "Follow the plan.",
        through_hand(hand),
        max_steps=8,
    )
    return Registry().add("agent", agent)
