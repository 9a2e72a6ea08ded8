"""PydanticAI on wakeful: ``WakefulAgent(agent, name=..., runtime=...)`` runs a PydanticAI
agent as a durable run on a thread (extra ``pydantic-ai``; docs/pydantic-ai.md)."""

from wakeful.pydantic_ai.agent import WakefulAgent
from wakeful.pydantic_ai.journal import INDETERMINATE, REPLAY_POLICIES, idempotency_key

__all__ = ["INDETERMINATE", "REPLAY_POLICIES", "WakefulAgent", "idempotency_key"]
