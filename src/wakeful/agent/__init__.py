"""Agents: a model node, tool tasks with replay policies, approvals and stream recovery."""

from wakeful.agent.agent import INDETERMINATE, Agent, AgentReply, Approval
from wakeful.agent.delegation import delegate, handoff
from wakeful.agent.recovery import StreamPolicy, StreamRecovery, Turn
from wakeful.agent.tools import ArgumentsInvalid, Tool, ToolContext, tool

__all__ = [
    "INDETERMINATE",
    "Agent",
    "AgentReply",
    "Approval",
    "ArgumentsInvalid",
    "StreamPolicy",
    "StreamRecovery",
    "Tool",
    "ToolContext",
    "Turn",
    "delegate",
    "handoff",
    "tool",
]
