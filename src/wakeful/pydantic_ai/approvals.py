"""PydanticAI's deferred tools (``requires_approval``) as wakeful tickets.

A PydanticAI run whose output is ``DeferredToolRequests`` with approvals suspends the
wakeful run with one ticket whose question lists the calls
(``{"approval": [{"call_id", "tool", "arguments"}, ...]}``). The answer, from any process,
days later, is a decision for all the calls (``"approve"``, ``"deny"``, ``True``,
``{"approve": False, "reason": "..."}``) or a mapping of call id to decision; it is kept
in the run's state (so later supersteps do not ask again) and passed to PydanticAI as
``DeferredToolResults``, which continues the run (an approved call is a tool step under its
replay policy; a denied one returns the denial to the model)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolDenied


def pending(output: Any) -> DeferredToolRequests | None:
    """The approvals a run's output waits for (``None``: it waits for none, or also for
    external calls, which are returned to the caller as PydanticAI does)."""
    if isinstance(output, DeferredToolRequests) and output.approvals and not output.calls:
        return output
    return None


def question(requests: DeferredToolRequests) -> dict[str, Any]:
    return {
        "approval": [
            {"call_id": c.tool_call_id, "tool": c.tool_name, "arguments": c.args_as_dict()}
            for c in requests.approvals
        ]
    }


def decisions(requests: DeferredToolRequests, answer: Any) -> dict[str, dict[str, Any]]:
    """The answer as ``{call_id: {"approve": bool, "reason": str | None}}``."""
    ids = [c.tool_call_id for c in requests.approvals]
    if isinstance(answer, Mapping) and set(answer) & set(ids):
        return {i: _one(answer.get(i, False)) for i in ids}
    return {i: _one(answer) for i in ids}


def _one(answer: Any) -> dict[str, Any]:
    if isinstance(answer, bool):
        return {"approve": answer, "reason": None}
    if isinstance(answer, str):
        approved = answer.lower() in ("approve", "approved", "yes", "allow")
        return {"approve": approved, "reason": None}
    if isinstance(answer, Mapping):
        reason = answer.get("reason")
        approved = bool(answer.get("approve", answer.get("approved", False)))
        return {"approve": approved, "reason": str(reason) if reason is not None else None}
    return {"approve": False, "reason": "unrecognised decision"}


def results(decided: Mapping[str, Mapping[str, Any]]) -> DeferredToolResults:
    return DeferredToolResults(
        approvals={
            call_id: True
            if d.get("approve")
            else ToolDenied(str(d.get("reason") or "The tool call was denied."))
            for call_id, d in decided.items()
        }
    )
