"""``delegate``: a built-in tool that hands a request to another registered agent as a
child run (``NodeContext.spawn``) and returns its reply to the model.

The calling agent's run waits for the child without its claim or a worker slot (a join:
``NodeContext.join``) and is resumed by the child's end; the child runs once, on its own
thread (``<agent thread>:tool:<digest>``), whatever crashes in between. A child that fails
is the tool's ``error`` result, which the model sees and may handle."""

from __future__ import annotations

import msgspec

from wakeful.agent.tools import Tool
from wakeful.errors import ChildFailed
from wakeful.ids import check_id
from wakeful.runtime.context import NodeContext


class DelegateArguments(msgspec.Struct, forbid_unknown_fields=True):
    request: str
    """What the other agent is asked: its user message."""


async def _never(request: str) -> str:  # a delegate runs through ``delegated``
    raise RuntimeError("a delegate tool runs as a child run, not as a function")


def delegate(
    target: str,
    *,
    name: str | None = None,
    description: str | None = None,
    approval: bool = False,
) -> Tool:
    """A tool (default name ``ask_<target>``) that sends the model's ``request`` to the
    registered agent ``target`` as a child run (the request is its user message) and
    returns its final answer. Needs a worker fleet whose registry has ``target``.
    ``approval``: a person approves each call first (as for any tool)."""
    check_id("target", target)
    tool_name = check_id("tool name", name or f"ask_{target}".replace(".", "_"))
    return Tool(
        name=tool_name,
        description=description or f"Ask {target} and get its answer.",
        fn=_never,
        replay="safe",
        approval=approval,
        arguments=DelegateArguments,
        takes_ctx=False,
        is_async=True,
        delegate=target,
    )


async def delegated(tool: Tool, arguments: dict[str, str], ctx: NodeContext) -> tuple[str, str]:
    """Run a delegate tool's call: spawn the child, join it; the tool's outcome and
    content. The join suspends the agent's run until the child ends (``Interrupt``)."""
    assert tool.delegate is not None
    child = await ctx.spawn(tool.delegate, arguments["request"])
    try:
        outcome = await ctx.join(child)
    except ChildFailed as failed:
        return "error", f"error: {failed}"
    if outcome.reply is not None:
        return "ok", outcome.reply
    return "ok", msgspec.json.encode(outcome.state).decode()


__all__ = ["delegate", "delegated"]
