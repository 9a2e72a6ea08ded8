"""Apps for the CLI tests, loaded by ``--app tests.cli_app:...``.

- ``registry``: a factory (fresh scripts each time the CLI loads it): ``greeter`` (an agent),
  ``tally`` (a graph summing its ``numbers`` input), ``asker`` (a graph that asks a question
  and suspends), ``flaky`` (a graph whose node fails with a transient error on its first
  call in a process, so the worker retries the dispatch and recovers the run), ``dropper``
  (an agent whose first stream drops after some text: stream recovery plan R1) and
  ``blocker`` (a graph whose node waits forever while ``CLI_APP_BLOCK`` is set, for crash
  tests); ``broken`` (a graph whose node always fails: the run fails); ``napper`` (a graph
  whose node sleeps half a second durably, ``ctx.sleep``, then sets ``total``).
- ``support``: a single Agent; ``tally_graph``: a single compiled graph.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, TypedDict

from wakeful.agent import Agent
from wakeful.errors import WakefulError
from wakeful.fleet import Registry
from wakeful.providers.scripted import Drop, Scripted, reply, text
from wakeful.runtime import END, START, Graph, RetryPolicy


class Tally(TypedDict, total=False):
    numbers: list[int]
    total: int


def _sum(state: Tally) -> dict[str, Any]:
    return {"total": sum(state.get("numbers", []))}


tally_graph = Graph(Tally, name="tally").node("sum", _sum).edge(START, "sum").compile()


class Question(TypedDict, total=False):
    answer: str


def _ask(state: Question, ctx: Any) -> dict[str, Any]:
    return {"answer": ctx.interrupt("Proceed?")}


class Flaky(WakefulError):
    """A transient failure (``retryable``): the run stops without an ending."""

    retryable = True


_flaky_calls = {"n": 0}


def _flaky(state: Tally) -> dict[str, Any]:
    _flaky_calls["n"] += 1
    if _flaky_calls["n"] == 1:
        raise Flaky("the first call of flaky fails on purpose")
    return {"total": 1}


def _broken(state: Tally) -> dict[str, Any]:
    raise ValueError("broken on purpose")


async def _block(state: Tally) -> dict[str, Any]:
    if os.environ.get("CLI_APP_BLOCK"):
        await asyncio.Event().wait()
    return {"total": 2}


async def _nap(state: Tally, ctx: Any) -> dict[str, Any]:
    await ctx.sleep(0.5)
    return {"total": 4}


def registry() -> Registry:
    # as many greetings as a test or docs/client.md's example asks of one worker process
    greeter = Scripted.of(*[reply("Hello from the command line.", chunk=5)] * 50)
    dropper = Scripted.of([*text("Half an ans"), Drop()], reply("wer, continued."))
    asker = Graph(Question, name="asker").node("ask", _ask).edge(START, "ask").edge("ask", END)
    flaky = Graph(Tally, name="flaky").node("work", _flaky).edge(START, "work")
    blocker = Graph(Tally, name="blocker").node("work", _block).edge(START, "work")
    broken = Graph(Tally, name="broken").node("work", _broken, retry=RetryPolicy(max_attempts=1))
    return (
        Registry()
        .add("greeter", Agent("greeter", greeter, "Greet."))
        .add("dropper", Agent("dropper", dropper, "Answer."))
        .add("tally", tally_graph)
        .add("asker", asker.compile())
        .add("flaky", flaky.compile())
        .add("blocker", blocker.compile())
        .add("broken", broken.edge(START, "work").compile())
        .add("napper", Graph(Tally, name="napper").node("nap", _nap).edge(START, "nap").compile())
    )


support = Agent("support", Scripted.of(reply("How can I help?")), "Help.")

not_an_app = {"this": "is a dict"}


def hand_tools() -> dict[str, object]:
    def echo(text: str) -> str:
        return text

    return {"echo": echo}


__all__ = ["registry", "support", "tally_graph"]
