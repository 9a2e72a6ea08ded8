"""Child process for the Agents SDK crash test. ``python -m tests.oai_child URL DIR``.

Triage hands off to billing; billing calls ``refund`` (replay ``never``) and ``lookup``
(``safe``) in one turn. Each tool records its start in DIR/effects.txt and, in the child,
hangs after it, so the parent can SIGKILL the process between the tools' starts and their
recorded results (after the handoff was committed)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from agents import Agent as SDKAgent
from agents import function_tool
from agents.testing import ScriptedModel, assistant_message, function_call

from wakeful import open_store
from wakeful.openai_agents import WakefulRunner
from wakeful.runtime import ClaimPolicy, Runtime


def record(path: Path, line: str) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def team(directory: Path, *, hang: bool, replayed: bool) -> tuple[SDKAgent[Any], Any, Any]:
    """The triage agent (its handoff leads to billing) and both scripted models. A replayed
    team's models script only what is left after the crash: billing's final answer."""

    async def effect(name: str) -> str:
        record(directory / "effects.txt", name)
        if hang:
            (directory / f"{name}.started").write_text("x")
            await asyncio.Event().wait()
        return f"{name} done"

    @function_tool
    async def refund(amount: int) -> str:
        """Refund money (never twice)."""
        return await effect("refund")

    @function_tool
    async def lookup(order: int) -> str:
        """Look an order up."""
        return await effect("lookup")

    final = [assistant_message("Refund handled.")]
    billing_steps = (
        [final]
        if replayed
        else [
            [
                function_call("refund", {"amount": 5}, call_id="c-refund"),
                function_call("lookup", {"order": 7}, call_id="c-lookup"),
            ],
            final,
        ]
    )
    billing_model = ScriptedModel(billing_steps)
    billing = SDKAgent(name="billing", model=billing_model, tools=[refund, lookup])
    triage_model = ScriptedModel(
        [] if replayed else [[function_call("transfer_to_billing", {}, call_id="h1")]]
    )
    triage = SDKAgent(name="triage", model=triage_model, handoffs=[billing])
    return triage, triage_model, billing_model


def runner(runtime: Runtime) -> WakefulRunner:
    return WakefulRunner(runtime, replay={"refund": "never"})


async def main(url: str, directory: Path) -> None:
    store = await open_store(url)
    runtime = Runtime(store, ClaimPolicy(ttl=5, renew_every=1), holder="child")
    triage, _, _ = team(directory, hang=True, replayed=False)
    await runner(runtime).agent(triage).start(runtime, "t", "refund order 7")
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
