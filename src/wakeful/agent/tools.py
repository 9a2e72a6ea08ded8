"""Tools: typed Python functions the model can call, with a replay policy.

The JSON schema of a tool's arguments comes from its signature (through msgspec); the
model's arguments are parsed and validated against it before the function runs. A tool may
take a ``ctx: ToolContext`` parameter (not part of the schema) to get an idempotency key and
the claim's fencing token.

Replay policies say what happens when a run is recovered and a call has no recorded result:
``safe`` runs it again; ``keyed`` runs it again with the same idempotency key (for systems
that deduplicate); ``never`` is not run again if it may have started (its start is recorded
before it runs): its result is ``Indeterminate``. A tool that returns ``INDETERMINATE``
(``wakeful.agent.agent``) or raises ``wakeful.errors.OutcomeUnknown`` is recorded
``indeterminate`` whatever its policy."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, NoReturn, TypeAlias, get_type_hints, overload

import msgspec

from wakeful.clock import Clock, SystemClock
from wakeful.errors import InvalidInput
from wakeful.ids import check_id
from wakeful.providers.base import ToolSpec
from wakeful.runtime.children import ChildOutcome, ChildRun
from wakeful.runtime.context import NodeContext

Replay: TypeAlias = Literal["safe", "keyed", "never"]
REPLAYS = ("safe", "keyed", "never")


@dataclass(frozen=True)
class ToolContext:
    """What a tool that asks for ``ctx`` receives."""

    thread_id: str
    run_id: str
    call_id: str
    idempotency_key: str
    """Deterministic per thread, run, step and call: the same after a recovery."""
    fencing_token: int
    replay: Replay = "safe"
    """The tool's replay policy, so a client that can resolve a lost answer (``RemoteHand``)
    knows whether it may send the call again (``keyed``, ``safe``) or only look it up
    (``never``)."""
    patches: Collection[str] = ()
    """The patches the run started with (``patched``)."""
    node: NodeContext | None = field(default=None, repr=False)
    """The context of the tool task running the call (``spawn``, ``join``)."""

    clock: Clock = field(default_factory=SystemClock, repr=False, compare=False)
    """The run's clock (what ``sleep`` measures from)."""

    def patched(self, change_id: str) -> bool:
        """As ``NodeContext.patched``: whether the run started on code declaring the patch."""
        return change_id in self.patches

    async def sleep(self, duration: timedelta | float) -> NoReturn:
        """End this call with a durable sleep of ``duration`` (a ``timedelta`` or seconds):
        the run commits, releases its claim and is woken when the time has come, by any
        worker (an embedded ``Runtime`` keeps a timer). No process waits meanwhile.

        The call is not run again at the wake-up: its result, which the model reads when
        the turn goes on, is ``"slept until <wake time>"``. Code after this call in the
        tool does not run: what must happen after the wait is the model's next step. A
        tool that calls it must be ``async``."""
        seconds = duration.total_seconds() if isinstance(duration, timedelta) else duration
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
            raise InvalidInput("duration", "must be a timedelta or seconds, 0 or more")
        await self.sleep_until(self.clock.now() + timedelta(seconds=seconds))

    async def sleep_until(self, when: datetime) -> NoReturn:
        """End this call with a durable sleep until ``when`` (timezone-aware); see
        ``sleep``."""
        if not isinstance(when, datetime) or when.utcoffset() is None:
            raise InvalidInput("when", "must be a timezone-aware datetime")
        raise ToolSleep(when)

    async def spawn(self, target: str, input: Any = None, **options: Any) -> ChildRun:
        """``NodeContext.spawn`` from a tool: a child run, started once per call (a call
        run again after a crash or a resume gets the same child). Use ``replay="safe"`` or
        ``"keyed"`` for a tool that joins: a ``never`` tool is not run again on resume."""
        return await self._node_context().spawn(target, input, **options)

    async def join(self, child: ChildRun | dict[str, Any]) -> ChildOutcome:
        """``NodeContext.join`` from a tool: the agent's run waits for the child (without
        its claim or a worker slot) and the call runs again from its start once it ended."""
        return await self._node_context().join(child)

    def _node_context(self) -> NodeContext:
        if self.node is None:
            raise InvalidInput("ctx", "this tool context has no run to spawn children from")
        return self.node


class ToolSleep(BaseException):
    """Raised by ``ToolContext.sleep``: the call ends and its agent records the sleep. A
    ``BaseException``, so that a tool's ``except Exception`` does not swallow it."""

    def __init__(self, until: datetime) -> None:
        super().__init__(f"sleep until {until.isoformat()}")
        self.until = until


class ArgumentsInvalid(ValueError):
    """The model's arguments did not parse as complete JSON or did not validate."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    fn: Callable[..., Any]
    replay: Replay
    approval: bool
    arguments: type[msgspec.Struct]
    takes_ctx: bool
    is_async: bool
    delegate: str | None = None
    """For a ``delegate`` tool: the registered target each call runs as a child run."""
    handoff: bool = False
    """For a ``handoff`` tool (a ``delegate`` one too): the child gets the conversation,
    and its reply ends the calling agent's run as its final answer."""

    @property
    def spec(self) -> ToolSpec:
        schema = msgspec.json.schema(self.arguments)
        defs = schema.pop("$defs", {})
        ref = schema.get("$ref", "")
        body = dict(defs.get(ref.rsplit("/", 1)[-1], schema)) if ref else schema
        body.pop("title", None)
        if len(defs) > 1:
            body["$defs"] = {k: v for k, v in defs.items() if k != self.arguments.__name__}
        return ToolSpec(name=self.name, description=self.description, parameters=body)

    def parse(self, raw: str) -> dict[str, Any]:
        """Parse and validate the model's argument text; raises ``ArgumentsInvalid``."""
        try:
            value = msgspec.json.decode(raw or "{}")
        except msgspec.DecodeError as exc:
            raise ArgumentsInvalid(f"arguments are not complete JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ArgumentsInvalid("arguments must be a JSON object")
        try:
            validated = msgspec.convert(value, self.arguments)
        except msgspec.ValidationError as exc:
            raise ArgumentsInvalid(f"arguments do not validate: {exc}") from None
        return {f: getattr(validated, f) for f in validated.__struct_fields__}

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        kwargs = dict(arguments)
        if self.takes_ctx:
            kwargs["ctx"] = ctx
        if self.is_async:
            return await self.fn(**kwargs)
        import asyncio

        return await asyncio.to_thread(self.fn, **kwargs)


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    replay: Replay = "safe",
    approval: bool = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    replay: Replay = "safe",
    approval: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a typed function a tool: ``@tool`` or ``@tool(replay="never", approval=True)``.
    Every parameter but ``ctx`` needs a type annotation; defaults make arguments optional;
    the docstring's first paragraph is the description."""
    if replay not in REPLAYS:
        raise InvalidInput("replay", f"must be one of {REPLAYS}")

    def make(func: Callable[..., Any]) -> Tool:
        tool_name = check_id("tool name", name or func.__name__)
        hints = get_type_hints(func)
        fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
        takes_ctx = False
        for param in inspect.signature(func).parameters.values():
            if param.name == "ctx":
                takes_ctx = True
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise InvalidInput("tool", f"{tool_name}: *args and **kwargs are not supported")
            if param.name not in hints:
                raise InvalidInput("tool", f"{tool_name}: parameter {param.name!r} needs a type")
            if param.default is param.empty:
                fields.append((param.name, hints[param.name]))
            else:
                fields.append((param.name, hints[param.name], param.default))
        arguments = msgspec.defstruct(
            f"{tool_name.replace('.', '_').replace('-', '_')}_arguments",
            fields,
            forbid_unknown_fields=True,
        )
        doc = inspect.getdoc(func) or ""
        return Tool(
            name=tool_name,
            description=description or doc.split("\n\n", 1)[0].strip(),
            fn=func,
            replay=replay,
            approval=approval,
            arguments=arguments,
            takes_ctx=takes_ctx,
            is_async=inspect.iscoroutinefunction(func),
        )

    return make(fn) if fn is not None else make
