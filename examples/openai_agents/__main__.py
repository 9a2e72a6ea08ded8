"""An OpenAI Agents SDK triage agent handing off to billing, run durably by wakeful.

``python -m examples.openai_agents [STORE_URL]`` (default ``sqlite:///openai-agents.db``).
The models are the SDK's own ``ScriptedModel`` so it runs offline; put a real model
(``model="gpt-4o-mini"``, or ``OpenAIChatCompletionsModel``) on the agents to use one.
Run it twice: the second run continues the same thread, with billing."""

from __future__ import annotations

import asyncio
import sys

from agents import Agent, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call

from wakeful import Runtime, open_store
from wakeful.openai_agents import WakefulRunner


@function_tool
def refund(order: int) -> str:
    """Refund an order (must never run twice)."""
    return f"order {order} refunded"


def agents() -> Agent[None]:
    billing = Agent(
        name="billing",
        instructions="Handle refunds.",
        tools=[refund],
        model=ScriptedModel(
            [
                [function_call("refund", {"order": 42}, call_id="c1")],
                [assistant_message("Order 42 is refunded.")],
                [assistant_message("Anything else about order 42?")],
            ]
        ),
    )
    triage_model = ScriptedModel([[function_call("transfer_to_billing", {}, call_id="h1")]])
    return Agent(name="triage", model=triage_model, handoffs=[billing])


async def main(url: str) -> None:
    triage = agents()
    async with open_store(url) as store:
        runner = WakefulRunner(Runtime(store), replay={"refund": "never"})
        first = await runner.run(triage, "Refund order 42", thread_id="customer-42")
        print(first.last_agent.name, "->", first.final_output)
        second = await runner.run(triage, "Thanks!", thread_id="customer-42")
        print(second.last_agent.name, "->", second.final_output)
        print(len(await store.messages("customer-42")), "messages on the thread")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "sqlite:///openai-agents.db"))
