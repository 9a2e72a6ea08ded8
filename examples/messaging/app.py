"""Two services that talk through messages: ``orders`` and ``billing``.

An order thread (``order-<n>``) places the order and sends a message to the invoice thread
(``invoice-<n>``); the message starts a ``billing`` run there, which drafts the invoice with
the model and sends a message back; that message starts a new run of the order's graph,
which records the payment. Messages are staged in the sender's commit (the outbox), moved
to the receiver's inbox by the relay exactly once, and consumed in the receiver's commit,
so a crash anywhere never loses or doubles one. Each side records a ``message.sent`` or
``message.received`` event in the same commit (``wakeful threads events order-1``).

Workers share one queue, so every worker registers both graphs; ``billing`` is the default
target of a message to a thread that has no run yet."""

from __future__ import annotations

from typing import Any, TypedDict

from examples.model import ask, chat_model
from wakeful.fleet import Registry
from wakeful.runtime import END, START, CompiledGraph, Graph, NodeContext


class Order(TypedDict, total=False):
    order_id: int
    amount_cents: int
    status: str  # placed -> paid
    invoice: dict[str, Any]


class Invoice(TypedDict, total=False):
    order_id: int
    amount_cents: int
    reply_to: str
    note: str


def orders_graph() -> CompiledGraph:
    def place(state: Order, ctx: NodeContext) -> dict[str, Any]:
        order_id = state["order_id"]
        to = f"invoice-{order_id}"
        sent = ctx.send(
            to,
            {
                "order_id": order_id,
                "amount_cents": state["amount_cents"],
                "reply_to": ctx.thread_id,
            },
            correlation_id=f"order-{order_id}",
        )
        ctx.emit("message.sent", {"to": to, "message_id": sent})
        return {"status": "placed"}

    def settle(state: Order, ctx: NodeContext) -> dict[str, Any]:
        ctx.emit("message.received", {"from": f"invoice-{state['order_id']}"})
        return {"status": "paid"}

    def route(state: dict[str, Any]) -> str:
        return "settle" if state.get("invoice") and state.get("status") == "placed" else "place"

    return (
        Graph(Order, name="orders")
        .node("place", place)
        .node("settle", settle)
        .conditional_edge(START, route, ["place", "settle"])
        .edge("place", END)
        .edge("settle", END)
        .compile()
    )


def billing_graph() -> CompiledGraph:
    model = chat_model()

    async def invoice(state: Invoice, ctx: NodeContext) -> dict[str, Any]:
        amount = state["amount_cents"] / 100
        note = await ask(
            model,
            "Write a one-line, friendly invoice note.",
            f"Order {state['order_id']}, {amount:.2f} EUR",
            f"note-{ctx.idempotency_key}",
        )
        ctx.emit("message.received", {"from": state["reply_to"]})
        invoice = {"number": f"INV-{state['order_id']:05d}", "amount": amount, "note": note}
        sent = ctx.send(state["reply_to"], {"invoice": invoice}, correlation_id=ctx.thread_id)
        ctx.emit("message.sent", {"to": state["reply_to"], "message_id": sent})
        return {"note": note}

    return Graph(Invoice, name="billing").node("invoice", invoice).edge(START, "invoice").compile()


def registry() -> Registry:
    """Both services' graphs (see the module docstring)."""
    return Registry(default="billing").add("orders", orders_graph()).add("billing", billing_graph())
