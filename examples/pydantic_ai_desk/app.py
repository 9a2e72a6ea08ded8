"""A PydanticAI support agent made durable by wakeful (docs/pydantic-ai.md).

The agent is plain PydanticAI: PydanticAI's OpenAI model (``OPENAI_BASE_URL``,
``OPENAI_API_KEY``, ``WAKEFUL_MODEL``), a ``lookup_order`` tool and a ``refund`` tool.
``WakefulAgent`` makes each model response and tool result a committed thread message and
gives ``refund`` the ``never`` policy: recovered after a crash, a refund whose start was
recorded is never paid twice (its result is ``INDETERMINATE``).

- Embedded: ``python -m examples.pydantic_ai_desk.app "Please refund order 42"``
  (store ``WAKEFUL_STORE``, default ``sqlite:///pydantic-desk.db``; thread ``DESK_THREAD``).
- A fleet target: ``wakeful worker --app examples.pydantic_ai_desk.app:registry``."""

from __future__ import annotations

import asyncio
import os
import sys

from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from wakeful import open_store
from wakeful.fleet import Registry
from wakeful.pydantic_ai import WakefulAgent, idempotency_key
from wakeful.runtime import Runtime


def build() -> WakefulAgent:
    provider = OpenAIProvider(
        base_url=os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1"),
        api_key=os.environ.get("OPENAI_API_KEY", "sk-unset"),
    )
    model = OpenAIChatModel(os.environ.get("WAKEFUL_MODEL", "gpt-4o-mini"), provider=provider)
    agent: Agent[None, str] = Agent(model, instructions="You help with orders. Be brief.")

    @agent.tool_plain
    def lookup_order(order_id: int) -> dict[str, object]:
        """Look up an order."""
        return {"order_id": order_id, "status": "delivered", "total": 42}

    @agent.tool_plain
    def refund(order_id: int) -> str:
        """Refund an order (runs at most once: replay policy ``never``)."""
        with open(os.environ.get("SUPPORT_LEDGER", "refunds.jsonl"), "a") as ledger:
            ledger.write(f'{{"order_id": {order_id}, "key": "{idempotency_key()}"}}\n')
        return f"refunded order {order_id}"

    return WakefulAgent(agent, name="pydantic-desk", replay={"refund": "never"})


desk = build()
registry = Registry(default="desk").add("desk", desk)


async def main(prompt: str) -> None:
    store = await open_store(os.environ.get("WAKEFUL_STORE", "sqlite:///pydantic-desk.db"))
    try:
        thread = os.environ.get("DESK_THREAD", "desk-1")
        result = await desk.run(prompt, thread_id=thread, runtime=Runtime(store))
        print(result.output)
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(" ".join(sys.argv[1:]) or "Please refund order 42"))
