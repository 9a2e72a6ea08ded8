"""``python -m examples.research [--store URL] [--answer yes] TOPIC``: run the research graph
in this process; the editor's approval is asked on the terminal (or given by --answer). The
store is ``--store``, else ``$WAKEFUL_STORE``, else ``sqlite:///research.db``."""

from __future__ import annotations

import argparse
import asyncio
import os
import uuid

from examples.research.app import build
from wakeful import open_store
from wakeful.runtime import Runtime


async def main(topic: str, store_url: str, answer: str | None) -> int:
    graph = build()
    thread = f"research-{uuid.uuid4().hex[:8]}"
    async with open_store(store_url) as store:
        runtime = Runtime(store)
        outcome = await (await runtime.start(thread, graph, {"topic": topic})).result()
        while outcome.status == "suspended":
            answers = {}
            for ticket in outcome.tickets:
                print(f"{ticket.question['ask']} ({ticket.question['findings']} findings)")
                answers[ticket.id] = answer or await asyncio.to_thread(input, "> ")
            outcome = await (await runtime.resume(thread, graph, answers)).result()
        for finding in outcome.state["findings"]:
            print(f"* {finding['question']}\n  {finding['answer']}")
        print(f"\n{outcome.state['report']}\n\nthread {thread}: {outcome.status}")
        return 0 if outcome.status == "completed" else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("topic", nargs="?", default="How do heat pumps work in cold climates?")
    parser.add_argument(
        "--store", default=os.environ.get("WAKEFUL_STORE") or "sqlite:///research.db"
    )
    parser.add_argument("--answer", default=None, help="Answer the approval without asking.")
    args = parser.parse_args()
    raise SystemExit(asyncio.run(main(args.topic, args.store, args.answer)))
