"""Durable runs for the OpenAI Agents SDK (extra ``openai-agents``): ``WakefulRunner``."""

from wakeful.openai_agents.runner import WakefulRunner, WakefulRunResult

__all__ = ["WakefulRunResult", "WakefulRunner"]
