"""``delegate`` and ``handoff``: built-in tools that pass work to another registered agent
as a child run (``NodeContext.spawn``).

- ``delegate``: the request is the child's user message; its reply is the tool result the
  calling agent's model reads, and the calling agent goes on (another model turn).
- ``handoff``: the child gets the conversation so far with the request; its reply is the
  tool result **and** the calling agent's final answer: its run completes with it, without
  another model turn (an assistant message with the reply, marked ``metadata.handoff``,
  ends its conversation).

The calling agent's run waits for the child without its claim or a worker slot (a join:
``NodeContext.join``) and is resumed by the child's end; the child runs once, on its own
thread (``<agent thread>:tool:<digest>``), whatever crashes in between. A child that fails
is the tool's ``error`` result, which the model sees and may handle (after a failed handoff
the calling agent goes on as after any failed tool)."""

from __future__ import annotations

from typing import Any

import msgspec

from wakeful.agent.tools import Tool
from wakeful.errors import ChildFailed
from wakeful.ids import check_id
from wakeful.records import Message
from wakeful.runtime.context import NodeContext

HANDOFF_TRANSCRIPT = 40
"""The latest user and assistant messages a handoff passes on (older ones are left out)."""


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


def handoff(
    target: str,
    *,
    name: str | None = None,
    description: str | None = None,
    approval: bool = False,
) -> Tool:
    """A tool (default name ``transfer_to_<target>``) that hands the conversation to the
    registered agent ``target``: a child run whose user message is the model's
    ``request`` followed by the conversation so far (its latest ``HANDOFF_TRANSCRIPT``
    user and assistant messages). The child's reply becomes this agent's final answer:
    its run completes with it, without another model turn. A failed child is an
    ``error`` result and this agent goes on. Needs a worker fleet whose registry has
    ``target``."""
    check_id("target", target)
    tool_name = check_id("tool name", name or f"transfer_to_{target}".replace(".", "_"))
    return Tool(
        name=tool_name,
        description=description
        or f"Hand the conversation to {target}, who answers the user from here on.",
        fn=_never,
        replay="safe",
        approval=approval,
        arguments=DelegateArguments,
        takes_ctx=False,
        is_async=True,
        delegate=target,
        handoff=True,
    )


def transcript(history: list[Message], request: str, agent: str) -> str:
    """The user message a handoff's child gets: the request, then the conversation."""
    lines = [request, "", f"Conversation so far (handed over by {agent}):"]
    said = [m for m in history if m.role in ("user", "assistant") and m.content]
    for m in said[-HANDOFF_TRANSCRIPT:]:
        lines.append(f"{m.role}: {m.content}")
    return "\n".join(lines)


async def delegated(
    tool: Tool, arguments: dict[str, Any], ctx: NodeContext, agent: str = ""
) -> tuple[str, str, dict[str, Any] | None]:
    """Run a delegate or handoff tool's call: spawn the child, join it; the tool's outcome,
    content and, for a completed handoff, the link to the child that answered (``None``
    otherwise). The join suspends the agent's run until the child ends (``Interrupt``)."""
    assert tool.delegate is not None
    request = str(arguments["request"])
    if tool.handoff:
        request = transcript(await ctx.history(), request, agent)
    child = await ctx.spawn(tool.delegate, request)
    try:
        outcome = await ctx.join(child)
    except ChildFailed as failed:
        return "error", f"error: {failed}", None
    content = outcome.reply
    if content is None:
        content = msgspec.json.encode(outcome.state).decode()
    if not tool.handoff:
        return "ok", content, None
    link = {"target": tool.delegate, "thread_id": child.thread_id, "run_id": child.run_id}
    return "ok", content, link


__all__ = ["HANDOFF_TRANSCRIPT", "delegate", "delegated", "handoff", "transcript"]
