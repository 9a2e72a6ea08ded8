"""A support agent that can refund orders, run by a worker fleet and driven over HTTP.

The refund tool is ``replay="never"``: once its start is recorded it never runs a second
time (a crash between the payment and the commit gives ``Indeterminate``, shown to the
model and to the operator, never a second payment), and it needs a human approval before it
runs. Refunds are written to a ledger file (``SUPPORT_LEDGER``, default ``refunds.jsonl``),
one line per idempotency key, standing in for a payment API.

Run it: ``wakeful serve --app examples.support_desk.app:registry`` and one or more
``wakeful worker --app examples.support_desk.app:registry``, then
``python -m examples.support_desk.drive``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TypedDict

from examples.model import chat_model
from wakeful.agent import Agent, ToolContext, tool
from wakeful.fleet import Registry


class OrderRecord(TypedDict):
    item: str
    amount_cents: int
    status: str


ORDERS: dict[int, OrderRecord] = {
    42: {"item": "espresso machine", "amount_cents": 24900, "status": "delivered"},
    43: {"item": "milk frother", "amount_cents": 3900, "status": "shipped"},
}


def ledger() -> Path:
    return Path(os.environ.get("SUPPORT_LEDGER", "refunds.jsonl"))


@tool(replay="safe")
def lookup_order(order_id: int) -> dict[str, Any]:
    """Look up an order by its number."""
    order = ORDERS.get(order_id)
    return {"order_id": order_id, **order} if order else {"error": f"no order {order_id}"}


@tool(replay="never", approval=True)
def refund(order_id: int, ctx: ToolContext) -> str:
    """Refund an order in full (a human approves each refund)."""
    order = ORDERS.get(order_id)
    if order is None:
        return f"there is no order {order_id}"
    path = ledger()
    done = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    if not any(json.loads(line)["key"] == ctx.idempotency_key for line in done):
        entry = {"key": ctx.idempotency_key, "order_id": order_id, "cents": order["amount_cents"]}
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())
    return f"refunded {order['amount_cents'] / 100:.2f} for order {order_id}"


INSTRUCTIONS = """You are the support desk of a coffee equipment shop. Be brief and polite.
Look orders up before acting. Refund only delivered orders, with the refund tool."""


def registry() -> Registry:
    """The worker's app: one agent, ``support``."""
    agent = Agent("support", chat_model(), INSTRUCTIONS, [lookup_order, refund], max_steps=6)
    return Registry(default="support").add("support", agent)
