"""A research graph: plan sub-questions, investigate them in parallel (``Send`` fan-out),
gather the findings through a reducer, ask an editor to approve (an interrupt), then write
the report.

    plan --Send--> investigate (one task per question) --> review (interrupt) --> write

Every superstep is committed, so a crash in the middle of the fan-out re-runs only the
questions whose findings were not committed yet.

Run it: ``python -m examples.research "How do heat pumps work in cold climates?"``
(answers the editor's question on the terminal), or with the ``wakeful`` command as
``examples/README.md`` shows: ``wakeful run`` until the interrupt, ``wakeful resume`` with
the answer, and a ``wakeful worker`` that continues the run."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

from examples.model import ask, chat_model
from wakeful.fleet import Registry
from wakeful.runtime import END, START, CompiledGraph, Graph, NodeContext, Send, append

MAX_QUESTIONS = 3


class Research(TypedDict, total=False):
    topic: str
    questions: list[str]
    findings: Annotated[list[dict[str, str]], append]  # one entry per investigated question
    approved: bool
    report: str


def build() -> CompiledGraph:
    model = chat_model()

    async def plan(state: Research, ctx: NodeContext) -> dict[str, Any]:
        text = await ask(
            model,
            f"List at most {MAX_QUESTIONS} short research questions, one per line, no numbers.",
            state["topic"],
            f"plan-{ctx.idempotency_key}",
        )
        lines = [q.strip(" -*\t") for q in text.splitlines() if q.strip(" -*\t")]
        return {"questions": lines[:MAX_QUESTIONS] or [state["topic"]]}

    def fan_out(state: dict[str, Any]) -> list[Send]:
        return [Send("investigate", question) for question in state["questions"]]

    async def investigate(question: str, ctx: NodeContext) -> dict[str, Any]:
        answer = await ask(model, "Answer in two sentences.", question, f"q-{ctx.idempotency_key}")
        return {"findings": [{"question": question, "answer": answer}]}

    def review(state: Research, ctx: NodeContext) -> dict[str, Any]:
        verdict = ctx.interrupt(
            {"ask": "Publish this report?", "findings": len(state.get("findings", []))}
        )
        return {"approved": str(verdict).lower() in ("yes", "y", "approve", "true")}

    async def write(state: Research, ctx: NodeContext) -> dict[str, Any]:
        if not state.get("approved"):
            return {"report": "(not approved)"}
        notes = "\n".join(f"- {f['question']}: {f['answer']}" for f in state["findings"])
        report = await ask(
            model,
            "Write a short report from these notes.",
            f"Topic: {state['topic']}\n{notes}",
            f"report-{ctx.idempotency_key}",
        )
        return {"report": report}

    return (
        Graph(Research, name="research")
        .node("plan", plan)
        .node("investigate", investigate)
        .node("review", review)
        .node("write", write)
        .edge(START, "plan")
        .conditional_edge("plan", fan_out, ["investigate"])
        .edge("investigate", "review")
        .edge("review", "write")
        .edge("write", END)
        .compile()
    )


def registry() -> Registry:
    """The worker's app: one graph, ``research``."""
    return Registry(default="research").add("research", build())
