"""Child process for agent crash tests. ``python -m tests.agent_child MODE URL DIR``.

- ``tools``: the model calls three tools (safe, keyed, never) in one turn; each records its
  start (and key) in DIR/effects.txt and then hangs on its first run, so the parent can kill
  the process between a tool's start and its recorded result.
- ``approval``: the model calls a tool that needs approval; the run suspends and the child
  exits normally.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from wakeful import open_store
from wakeful.agent import Agent, ToolContext, tool
from wakeful.providers.scripted import Scripted, calls, reply
from wakeful.runtime import ClaimPolicy, Runtime


def record(path: Path, line: str) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def effects_tools(directory: Path, hang: bool) -> list[Any]:
    effects = directory / "effects.txt"

    async def body(name: str, key: str) -> str:
        record(effects, f"{name} {key}")
        if hang:
            (directory / f"{name}.started").write_text("x")
            await asyncio.Event().wait()
        return f"{name} done"

    @tool(replay="safe")
    async def safe_op(n: int, ctx: ToolContext) -> str:
        """A safe operation."""
        return await body("safe", ctx.idempotency_key)

    @tool(replay="keyed")
    async def keyed_op(n: int, ctx: ToolContext) -> str:
        """A keyed operation."""
        return await body("keyed", ctx.idempotency_key)

    @tool(replay="never")
    async def never_op(n: int, ctx: ToolContext) -> str:
        """An operation that must never run twice."""
        return await body("never", ctx.idempotency_key)

    return [safe_op, keyed_op, never_op]


def tools_agent(directory: Path, hang: bool) -> Agent:
    provider = Scripted.of(
        calls(
            ("c-safe", "safe_op", {"n": 1}),
            ("c-keyed", "keyed_op", {"n": 2}),
            ("c-never", "never_op", {"n": 3}),
        ),
        reply("All three handled."),
    )
    return Agent("ops", provider, "Do it.", effects_tools(directory, hang))


def approval_agent(directory: Path) -> Agent:
    @tool(approval=True)
    def transfer(amount: int) -> str:
        """Move money."""
        record(directory / "effects.txt", f"transfer {amount}")
        return f"moved {amount}"

    provider = Scripted.of(
        calls(("c-transfer", "transfer", {"amount": 100})), reply("Transferred.")
    )
    return Agent("bank", provider, "Careful.", [transfer])


async def main(mode: str, url: str, directory: Path) -> None:
    store = await open_store(url)
    runtime = Runtime(store, ClaimPolicy(ttl=5, renew_every=1), holder="child")
    if mode == "tools":
        await tools_agent(directory, hang=True).start(runtime, "t", "go")
        await asyncio.Event().wait()
    else:
        result = await approval_agent(directory).run(runtime, "t", "pay 100")
        (directory / "suspended").write_text(result.approvals[0].ticket_id)
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
