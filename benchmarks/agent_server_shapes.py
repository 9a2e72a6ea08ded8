"""The same ``langgraph-sdk`` calls against ``wakeful serve`` and ``langgraph dev``, and where
their answers' shapes differ (keys, and value types down the tree): the compatibility check
of issue 44 against LangGraph's own server, run by hand where ``langgraph dev`` is installed
(``--lgapi-venv``, see ``benchmarks.agent_server``).

``python -m benchmarks.agent_server_shapes`` prints, per call, the keys only one server
sends and the keys whose value shapes differ; nothing when they agree.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.agent_server import INPUT, langgraph_dev, wakeful_server


async def calls(url: str, headers: dict[str, str]) -> dict[str, Any]:
    from langgraph_sdk import get_client

    c: Any = get_client(url=url, headers=headers)  # the SDK types copy as None, crons as Run
    out: dict[str, Any] = {}
    try:
        aid = (await c.assistants.search(graph_id="agent"))[0]["assistant_id"]
        out["assistants.get"] = await c.assistants.get(aid)
        thread = await c.threads.create(metadata={"k": "v"})
        tid = thread["thread_id"]
        out["threads.create"] = thread
        out["threads.get"] = await c.threads.get(tid)
        out["threads.update"] = await c.threads.update(tid, metadata={"x": 1})
        out["runs.wait"] = await c.runs.wait(tid, aid, input=INPUT)
        out["threads.get after a run"] = await c.threads.get(tid)
        out["threads.get_state"] = await c.threads.get_state(tid)
        out["threads.get_history"] = (await c.threads.get_history(tid))[0]
        out["threads.search"] = (await c.threads.search(metadata={"k": "v"}))[0]
        out["threads.count"] = await c.threads.count()
        out["threads.copy"] = await c.threads.copy(tid)
        out["assistants.count"] = await c.assistants.count()
        out["assistants.get_graph"] = await c.assistants.get_graph(aid)
        out["assistants.get_schemas"] = await c.assistants.get_schemas(aid)
        on_thread = await c.crons.create_for_thread(tid, aid, schedule="*/5 * * * *", input=INPUT)
        out["crons.create_for_thread"] = on_thread
        out["crons.create"] = await c.crons.create(aid, schedule="0 9 * * *", input=INPUT)
        out["crons.search"] = (await c.crons.search(thread_id=tid))[0]
        out["crons.count"] = await c.crons.count()
        out["info"] = await c.http.get("/info")
        await c.crons.delete(on_thread["cron_id"])
        await c.crons.delete(out["crons.create"]["cron_id"])
        await c.threads.delete(tid)
    finally:
        await c.aclose()
    return out


def shape(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def differences(theirs: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    lines = []
    for call in theirs:
        a, b = shape(theirs[call]), shape(ours.get(call))
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            only_a = sorted(set(a) - set(b))
            only_b = sorted(set(b) - set(a))
            differ = sorted(k for k in set(a) & set(b) if a[k] != b[k])
            lines.append(
                f"{call}: only langgraph-api {only_a}; only wakeful {only_b}; differ {differ}"
            )
        else:
            lines.append(f"{call}: langgraph-api {a!r}; wakeful {b!r}")
    return lines


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.agent_server_shapes")
    parser.add_argument("--lgapi-venv", type=Path, default=Path("/tmp/lgapi-venv"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="agent-shapes-") as tmp:
        work = Path(tmp)
        with langgraph_dev(args.lgapi_venv, work) as (url, headers):
            theirs = asyncio.run(calls(url, headers))
        with wakeful_server(f"sqlite:///{work / 'shapes.db'}", work) as (url, headers):
            ours = asyncio.run(calls(url, headers))
    found = differences(theirs, ours)
    print("\n".join(found) if found else "the same shapes")
    return found


if __name__ == "__main__":
    main()
