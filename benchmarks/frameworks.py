"""Benchmark: a 3-step agent run through wakeful's framework wrappers beside the frameworks'
own DBOS integrations.

Run ``python -m benchmarks.frameworks [--runs 100] [--rounds 3] [--dsn DSN] [--dir PATH]``.
The same agent in each pair, each run on a fresh thread / workflow, sequential, in runs per
second (medians of the rounds): a model call that asks for a tool, the tool, a model call
that answers (an instant in-process model: what is measured is the durable machinery).

- PydanticAI: ``WakefulAgent`` (``durability="sync"``: one fenced commit per step) beside
  the same ``Agent`` with ``pydantic_ai.durable_exec.dbos.DBOSDurability`` run inside a
  ``@DBOS.workflow`` (its model requests are DBOS steps; the function tool is made one with
  ``@DBOS.step``, which the integration leaves to the user);
- OpenAI Agents SDK: ``WakefulRunner`` (``streamed=False``: ``get_response``, as DBOS
  calls it) beside ``dbos_openai_agents.DBOSRunner.run`` inside a ``@DBOS.workflow`` with the
  tool a ``@DBOS.step`` (DBOS's documented setup);

each on SQLite (a file on the same disk; DBOS's system database ``sqlite:///...``) and on
PostgreSQL (a fresh database on the same server for each side). A DBOS measurement runs in a
subprocess of its own (DBOS is a process-wide singleton). Without the ``dbos`` package the
DBOS side is skipped with a message: install it beside this project's packages, e.g.
``python -m venv /tmp/dbos-venv && /tmp/dbos-venv/bin/pip install dbos dbos-openai-agents
'pydantic-ai-slim[openai]' openai-agents 'psycopg[binary]' psycopg-pool msgspec cronsim httpx
click rich prometheus-client`` and run ``PYTHONPATH=src /tmp/dbos-venv/bin/python -m
benchmarks.frameworks``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.common import DEFAULT_DSN, Collector, Database, Result

RUNS = 100
POOL = 4
"""Connections of each side's PostgreSQL pool (the runs are sequential; the server is
shared)."""
ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = ("pydantic-ai", "openai-agents")
ANSWER = "order 7 has shipped"


# ---------------------------------------------------------------- the agents


def pydai_agent(step: Any = None, **options: Any) -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        for message in messages:
            for part in message.parts:
                if part.part_kind == "tool-return":
                    return ModelResponse(parts=[TextPart(f"order 7 has {part.content}")])
        return ModelResponse(parts=[ToolCallPart("lookup", {"order": 7}, tool_call_id="c1")])

    agent: Any = Agent(FunctionModel(respond), name="bench", **options)

    async def lookup(order: int) -> str:
        """Look an order up."""
        return "shipped"

    agent.tool_plain(step(lookup) if step is not None else lookup)
    return agent


def sdk_model() -> Any:
    """A stateless Agents SDK model: asks for ``lookup`` until the input holds its output."""
    from agents import Model
    from agents.items import ModelResponse
    from agents.usage import Usage
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    class Stateless(Model):
        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            items = args[1] if len(args) > 1 else kwargs.get("input")
            answered = isinstance(items, list) and any(
                _field(i, "type") == "function_call_output" for i in items
            )
            output: list[Any]
            if answered:
                text = ResponseOutputText(type="output_text", text=ANSWER, annotations=[])
                output = [
                    ResponseOutputMessage(
                        id="m1",
                        type="message",
                        role="assistant",
                        status="completed",
                        content=[text],
                    )
                ]
            else:
                call = ResponseFunctionToolCall(
                    type="function_call", call_id="c1", name="lookup", arguments='{"order": 7}'
                )
                output = [call]
            return ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the benchmark's model answers whole")

    return Stateless()


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def sdk_agent(step: Any = None) -> Any:
    from agents import Agent, function_tool, set_tracing_disabled

    set_tracing_disabled(True)

    async def lookup(order: int) -> str:
        """Look an order up."""
        return "shipped"

    tool = function_tool(step(lookup) if step is not None else lookup)
    return Agent(name="bench", model=sdk_model(), tools=[tool])


# ---------------------------------------------------------------- wakeful's side


async def wakeful_rate(framework: str, url: str, runs: int) -> float:
    from wakeful import open_store
    from wakeful.runtime import Runtime

    options: dict[str, Any] = {"pool_size": POOL} if url.startswith("postgres") else {}
    store = await open_store(url, **options)
    try:
        runtime = Runtime(store)
        if framework == "pydantic-ai":
            from wakeful.pydantic_ai import WakefulAgent

            wa = WakefulAgent(pydai_agent(), name="bench", runtime=runtime)

            async def one(thread: str) -> Any:
                return (await wa.run("where is order 7?", thread_id=thread)).output

        else:
            from wakeful.openai_agents import WakefulRunner

            runner = WakefulRunner(runtime, streamed=False)
            agent = sdk_agent()

            async def one(thread: str) -> Any:
                return (await runner.run(agent, "where is order 7?", thread_id=thread)).final_output

        assert await one(f"warm-{uuid.uuid4().hex}") == ANSWER
        start = time.perf_counter()
        for i in range(runs):
            assert await one(f"t-{i}-{uuid.uuid4().hex[:8]}") == ANSWER
        return runs / (time.perf_counter() - start)
    finally:
        await store.close()


# ---------------------------------------------------------------- DBOS's side (a child)


async def dbos_rate(framework: str, url: str, runs: int) -> float:
    """In a process of its own: the same agent under the framework's DBOS integration."""
    from dbos import DBOS

    run: Any
    if framework == "pydantic-ai":
        from pydantic_ai.durable_exec.dbos import DBOSDurability

        # its function tools are not steps by themselves: the tool is a step, as DBOS's
        # documentation has it
        agent = pydai_agent(DBOS.step(), capabilities=[DBOSDurability()])

        async def run(prompt: str) -> str:
            return str((await agent.run(prompt)).output)

    else:
        from dbos_openai_agents import DBOSRunner

        sdk = sdk_agent(DBOS.step())

        async def run(prompt: str) -> str:
            return str((await DBOSRunner.run(sdk, prompt)).final_output)

    workflow: Any = DBOS.workflow(name=f"bench-{framework}")(run)
    # a small pool, as wakeful's store below: the runs are sequential
    config: Any = {
        "name": "wakeful-bench",
        "system_database_url": url,
        "sys_db_pool_size": POOL,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    try:
        assert await workflow("where is order 7?") == ANSWER
        start = time.perf_counter()
        for _ in range(runs):
            assert await workflow("where is order 7?") == ANSWER
        return runs / (time.perf_counter() - start)
    finally:
        DBOS.destroy()


def dbos_in_child(framework: str, url: str, runs: int) -> float:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.frameworks", "--dbos-child", framework, url, str(runs)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    if done.returncode != 0:
        raise RuntimeError(f"the DBOS child failed: {done.stderr[-2000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["rate"])


# ---------------------------------------------------------------- rounds and results


def _ours(framework: str, runs: int, url: str) -> float:
    return asyncio.run(wakeful_rate(framework, url, runs))


def _theirs(framework: str, runs: int, url: str) -> float:
    return dbos_in_child(framework, url, runs)


def one_round(args: argparse.Namespace, directory: Path, r: int, dbos: bool) -> dict[str, float]:
    """One sample of every measurement; one that fails (the shared PostgreSQL server went
    away) is left out of this round, with a message, rather than ending the benchmark."""
    rates: dict[str, float] = {}

    def take(key: str, measure: Any) -> None:
        try:
            rates[key] = float(measure())
        except Exception as exc:  # reported; the round goes on
            print(f"{key}, round {r}: not measured: {exc!r}"[:500], file=sys.stderr)

    def on_postgres(key: str, name: str, measure: Any) -> None:
        def run() -> float:
            database = Database(args.dsn, name).create()
            try:
                return float(measure(database.dsn))
            finally:
                database.drop()

        take(key, run)

    for framework in FRAMEWORKS:
        ours = f"sqlite:///{directory / f'wakeful-{framework}-{r}.db'}"
        take(f"{framework} wakeful sqlite", partial(_ours, framework, args.runs, ours))
        if dbos:
            theirs = f"sqlite:///{directory / f'dbos-{framework}-{r}.db'}"
            take(f"{framework} dbos sqlite", partial(_theirs, framework, args.runs, theirs))
        if args.no_postgres:
            continue
        tag = f"{framework.replace('-', '_')}_{os.getpid()}_{r}"
        on_postgres(
            f"{framework} wakeful postgres",
            f"wakeful_bench_fw_{tag}",
            partial(_ours, framework, args.runs),
        )
        if dbos:
            on_postgres(
                f"{framework} dbos postgres",
                f"wakeful_bench_fwd_{tag}",
                partial(_theirs, framework, args.runs),
            )
    return rates


NAMES = {"pydantic-ai": "WakefulAgent", "openai-agents": "WakefulRunner"}
THEIRS = {"pydantic-ai": "PydanticAI DBOSDurability", "openai-agents": "DBOSRunner"}


def results(samples: dict[str, list[float]], dbos: bool) -> list[Result]:
    out = Collector("frameworks")
    for framework in FRAMEWORKS:
        for store in ("sqlite", "postgres"):
            ours = samples.get(f"{framework} wakeful {store}")
            if ours is None:
                continue
            anchor = f"{THEIRS[framework]}, {store}"
            theirs = samples.get(f"{framework} dbos {store}")
            out.add(
                f"{NAMES[framework]}, 3-step run, {store}",
                ours,
                "runs/s",
                anchor=anchor,
                anchor_samples=theirs,
                skipped=None if dbos else "dbos is not installed: the DBOS side was not run",
            )
            if theirs is not None:
                out.add(anchor, theirs, "runs/s")
    return out.results


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=RUNS, help="agent runs per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians are reported")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="PostgreSQL server (admin DSN)")
    parser.add_argument("--dir", type=Path, default=None, help="directory on the disk to test")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument("--dbos-child", nargs=3, metavar=("FRAMEWORK", "URL", "RUNS"))
    args = parser.parse_args(argv if argv is not None else [])
    if args.dbos_child:
        framework, url, runs = args.dbos_child
        rate = asyncio.run(dbos_rate(framework, url, int(runs)))
        print(json.dumps({"rate": rate}))
        return []
    dbos = importlib.util.find_spec("dbos") is not None
    if not dbos:
        print(
            "dbos is not installed: only wakeful's side is measured (see this module's "
            "docstring for a venv with dbos)",
            file=sys.stderr,
        )
    elif importlib.util.find_spec("dbos_openai_agents") is None:
        print(
            "dbos-openai-agents is not installed: the Agents SDK's DBOS side fails", file=sys.stderr
        )
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="wakeful-bench-fw-", dir=args.dir) as tmp:
        for r in range(args.rounds):
            directory = Path(tmp) / f"round-{r}"
            directory.mkdir()
            for key, rate in one_round(args, directory, r, dbos).items():
                samples.setdefault(key, []).append(rate)
    print(
        f"3-step agent run (model, tool, model), sequential, {args.runs} runs per "
        f"measurement, {args.rounds} rounds (medians), runs/s"
    )
    print(f"{'framework':<14} {'store':<9} {'wakeful':>9} {'DBOS':>9} {'ratio':>7}")
    for framework in FRAMEWORKS:
        for store in ("sqlite", "postgres"):
            ours = samples.get(f"{framework} wakeful {store}")
            if ours is None:
                continue
            theirs = samples.get(f"{framework} dbos {store}")
            a = statistics.median(ours)
            b = statistics.median(theirs) if theirs else None
            shown = f"{b:>9.1f} {a / b:>6.2f}x" if b else f"{'-':>9} {'-':>7}"
            print(f"{framework:<14} {store:<9} {a:>9.1f} {shown}")
    return results(samples, dbos)


if __name__ == "__main__":
    main(sys.argv[1:])
