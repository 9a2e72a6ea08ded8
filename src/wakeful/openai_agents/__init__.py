"""Durable runs for the OpenAI Agents SDK (extra ``openai-agents``): ``Runner`` (the SDK's
``Runner`` signatures plus ``runtime=`` and ``thread_id=``) and ``WakefulRunner``."""

from wakeful.openai_agents.drop_in import Runner
from wakeful.openai_agents.runner import WakefulRunner, WakefulRunResult
from wakeful.openai_agents.streaming import WakefulRunResultStreaming

__all__ = ["Runner", "WakefulRunResult", "WakefulRunResultStreaming", "WakefulRunner"]
