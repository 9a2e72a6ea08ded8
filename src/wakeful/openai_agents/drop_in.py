"""``wakeful.openai_agents.Runner``: the Agents SDK's ``Runner`` with its signatures, durable.

``from wakeful.openai_agents import Runner`` instead of ``from agents import Runner``, and
pass ``runtime=`` (and ``thread_id=`` to continue a conversation):
``await Runner.run(agent, "hi", runtime=runtime, thread_id="t-1")``. Each call is a
``WakefulRunner`` run; the SDK keyword arguments wakeful does not carry (hooks, run_config,
sessions, server-side conversation ids, error handlers, a context object) are refused
rather than silently ignored."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from agents import Agent as SDKAgent

from wakeful.agent.recovery import StreamPolicy
from wakeful.errors import InvalidInput
from wakeful.openai_agents.runner import WakefulRunner, WakefulRunResult
from wakeful.openai_agents.streaming import WakefulRunResultStreaming
from wakeful.runtime import Runtime

DEFAULT_MAX_TURNS = 10
"""As the SDK's ``DEFAULT_MAX_TURNS``."""

_UNSUPPORTED = (
    "context",
    "hooks",
    "run_config",
    "error_handlers",
    "previous_response_id",
    "conversation_id",
    "session",
)


def _runner(
    runtime: Runtime | None,
    max_turns: int | None,
    replay: Mapping[str, str] | None,
    stream_policy: StreamPolicy | None,
    durability: str,
    input: Any,
    sdk: dict[str, Any],
) -> WakefulRunner:
    if runtime is None:
        raise InvalidInput("runtime", "pass runtime= (a wakeful Runtime over a store)")
    if not isinstance(input, str):
        raise InvalidInput("input", "a text input (the thread holds the conversation)")
    given = sorted(k for k in _UNSUPPORTED if sdk.get(k) not in (None, False))
    if sdk.get("auto_previous_response_id"):
        given.append("auto_previous_response_id")
    if given:
        raise InvalidInput(given[0], f"not supported by wakeful's Runner: {', '.join(given)}")
    return WakefulRunner(
        runtime,
        replay=replay,
        max_turns=max_turns or DEFAULT_MAX_TURNS,
        stream_policy=stream_policy,
        durability=durability,
    )


class Runner:
    """The SDK's ``Runner`` classmethods with ``runtime`` (required), ``thread_id`` (a
    fresh thread without it), ``tenant``, ``replay`` (tool name to ``safe`` / ``keyed`` /
    ``never``), ``stream_policy`` and ``durability`` added. ``run`` returns a
    ``WakefulRunResult`` (``final_output``, ``last_agent``, ``thread_id``, ``run_id``),
    ``run_streamed`` a ``WakefulRunResultStreaming`` (the SDK's ``RunResultStreaming``
    interface); ``recover`` continues a run whose process died."""

    @classmethod
    async def run(
        cls,
        starting_agent: SDKAgent[Any],
        input: str,
        *,
        context: Any = None,
        max_turns: int | None = DEFAULT_MAX_TURNS,
        hooks: Any = None,
        run_config: Any = None,
        error_handlers: Any = None,
        previous_response_id: str | None = None,
        auto_previous_response_id: bool = False,
        conversation_id: str | None = None,
        session: Any = None,
        runtime: Runtime | None = None,
        thread_id: str | None = None,
        tenant: str | None = None,
        replay: Mapping[str, str] | None = None,
        stream_policy: StreamPolicy | None = None,
        durability: str = "sync",
    ) -> WakefulRunResult:
        """``agents.Runner.run``, durable on ``runtime``'s thread ``thread_id``."""
        sdk = {
            "context": context,
            "hooks": hooks,
            "run_config": run_config,
            "error_handlers": error_handlers,
            "previous_response_id": previous_response_id,
            "auto_previous_response_id": auto_previous_response_id,
            "conversation_id": conversation_id,
            "session": session,
        }
        runner = _runner(runtime, max_turns, replay, stream_policy, durability, input, sdk)
        return await runner.run(starting_agent, input, thread_id=thread_id, tenant=tenant)

    @classmethod
    def run_sync(
        cls,
        starting_agent: SDKAgent[Any],
        input: str,
        **kwargs: Any,
    ) -> WakefulRunResult:
        """``run`` on a new event loop (inside a running loop use ``run``, as with the SDK).
        A store opened on another loop cannot be used here: open it in an async caller."""
        return asyncio.run(cls.run(starting_agent, input, **kwargs))

    @classmethod
    def run_streamed(
        cls,
        starting_agent: SDKAgent[Any],
        input: str,
        context: Any = None,
        max_turns: int | None = DEFAULT_MAX_TURNS,
        hooks: Any = None,
        run_config: Any = None,
        previous_response_id: str | None = None,
        auto_previous_response_id: bool = False,
        conversation_id: str | None = None,
        session: Any = None,
        *,
        error_handlers: Any = None,
        runtime: Runtime | None = None,
        thread_id: str | None = None,
        tenant: str | None = None,
        replay: Mapping[str, str] | None = None,
        stream_policy: StreamPolicy | None = None,
        durability: str = "sync",
    ) -> WakefulRunResultStreaming:
        """``agents.Runner.run_streamed`` (inside a running loop): the durable run starts
        now; iterate the result's ``stream_events()``."""
        sdk = {
            "context": context,
            "hooks": hooks,
            "run_config": run_config,
            "error_handlers": error_handlers,
            "previous_response_id": previous_response_id,
            "auto_previous_response_id": auto_previous_response_id,
            "conversation_id": conversation_id,
            "session": session,
        }
        runner = _runner(runtime, max_turns, replay, stream_policy, durability, input, sdk)
        return runner.run_streamed(starting_agent, input, thread_id=thread_id, tenant=tenant)

    @classmethod
    async def recover(
        cls,
        starting_agent: SDKAgent[Any],
        thread_id: str,
        *,
        runtime: Runtime,
        max_turns: int | None = DEFAULT_MAX_TURNS,
        tenant: str | None = None,
        replay: Mapping[str, str] | None = None,
        stream_policy: StreamPolicy | None = None,
    ) -> WakefulRunResult:
        """Continue the thread's run whose process died (after its claim expired)."""
        runner = WakefulRunner(
            runtime,
            replay=replay,
            max_turns=max_turns or DEFAULT_MAX_TURNS,
            stream_policy=stream_policy,
        )
        return await runner.recover(starting_agent, thread_id, tenant=tenant)
