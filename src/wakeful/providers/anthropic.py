"""An adapter for the Anthropic Messages API, over plain HTTP with server-sent events. No SDK,
no retries."""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import httpx
import msgspec

from wakeful.limits import RateLimit, check_limits
from wakeful.providers.base import (
    ModelRequest,
    ProviderError,
    StreamEnd,
    StreamItem,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from wakeful.providers.http import (
    HTTPProvider,
    Observation,
    TimeoutLike,
    decode_json,
    error_from_event,
    truncated,
)
from wakeful.providers.sse import aiter_sse
from wakeful.records import Message


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return "" if value is None else msgspec.json.encode(value).decode()


def _tool_input(call: Mapping[str, Any]) -> dict[str, Any]:
    arguments = call.get("arguments")
    if isinstance(arguments, dict):
        return arguments
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    try:
        parsed = msgspec.json.decode(arguments) if isinstance(arguments, str) else None
    except msgspec.DecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ProviderError(
            "invalid_request",
            f"tool call {call.get('id')!r}: arguments are not a JSON object; "
            "Anthropic needs tool_use input as an object",
        )
    return parsed


def _assistant(message: Message) -> dict[str, Any]:
    blocks: list[Any] = []
    if isinstance(message.content, list):
        blocks.extend(message.content)  # already content blocks
    elif text := _text(message.content):
        blocks.append({"type": "text", "text": text})
    for call in message.tool_calls:
        blocks.append(
            {"type": "tool_use", "id": call["id"], "name": call["name"], "input": _tool_input(call)}
        )
    return {"role": "assistant", "content": blocks}


def wire_messages(messages: tuple[Message, ...]) -> tuple[list[str], list[dict[str, Any]]]:
    """``(system parts, messages)`` in Messages API form: ``system`` messages move to the
    system prompt; tool results become ``tool_result`` blocks of a user message, consecutive
    results sharing one."""
    system: list[str] = []
    wire: list[dict[str, Any]] = []
    results: list[dict[str, Any]] | None = None
    for message in messages:
        if message.role == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id,
                "content": _text(message.content),
            }
            if results is None:
                results = [block]
                wire.append({"role": "user", "content": results})
            else:
                results.append(block)
            continue
        results = None
        if message.role == "system":
            system.append(_text(message.content))
        elif message.role == "assistant":
            wire.append(_assistant(message))
        else:
            content = message.content if isinstance(message.content, list) else None
            wire.append({"role": "user", "content": content or _text(message.content)})
    return system, wire


class _Events:
    """Turns decoded Messages stream events into stream items."""

    def __init__(self) -> None:
        self.tool_blocks: dict[int, int] = {}  # content block index -> tool call index
        self.tool_arguments: dict[int, bool] = {}  # tool call index -> got argument text
        self.text_blocks: set[int] = set()
        self.stop_reason: str | None = None
        self.usage: dict[str, int] = {}
        self.done = False

    def feed(self, kind: str, data: dict[str, Any]) -> list[StreamItem]:
        if kind == "content_block_delta":
            return self._delta(data)
        if kind == "content_block_start":
            return self._start(data)
        if kind == "content_block_stop":
            index = self.tool_blocks.get(data.get("index", -1))
            if index is not None and not self.tool_arguments[index]:
                self.tool_arguments[index] = True
                return [ToolCallDelta(index, arguments="{}")]  # a call without arguments
        elif kind == "message_start":
            message = data.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            self._usage(usage)
        elif kind == "message_delta":
            delta = data.get("delta")
            reason = delta.get("stop_reason") if isinstance(delta, dict) else None
            if isinstance(reason, str) and reason:
                self.stop_reason = reason
            self._usage(data.get("usage"))
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            raise error_from_event(data)
        return []  # ping, and event types added after this adapter was written

    def _start(self, data: dict[str, Any]) -> list[StreamItem]:
        block = data.get("content_block")
        index = data.get("index")
        if not isinstance(block, dict) or not isinstance(index, int):
            return []
        if block.get("type") == "text":
            self.text_blocks.add(index)
            text = block.get("text")
            return [TextDelta(text)] if isinstance(text, str) and text else []
        if block.get("type") == "tool_use":
            call = self.tool_blocks[index] = len(self.tool_blocks)
            self.tool_arguments[call] = False
            return [ToolCallDelta(call, id=block.get("id"), name=block.get("name"))]
        return []  # thinking, server tools ...: not part of the protocol

    def _delta(self, data: dict[str, Any]) -> list[StreamItem]:
        delta = data.get("delta")
        index = data.get("index")
        if not isinstance(delta, dict):
            return []
        if delta.get("type") == "text_delta" and index in self.text_blocks:
            text = delta.get("text")
            return [TextDelta(text)] if isinstance(text, str) and text else []
        if delta.get("type") == "input_json_delta" and isinstance(index, int):
            call = self.tool_blocks.get(index)
            partial = delta.get("partial_json")
            if call is not None and isinstance(partial, str) and partial:
                self.tool_arguments[call] = True
                return [ToolCallDelta(call, arguments=partial)]
        return []

    def _usage(self, usage: Any) -> None:
        # Usage fields are cumulative and each is optional: a message_delta that carries
        # input_tokens but not the cache fields keeps message_start's cache counts.
        if not isinstance(usage, dict):
            return
        for key in (*_INPUT_FIELDS, "output_tokens"):
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                self.usage[key] = value

    def end(self) -> StreamEnd:
        stop = self.stop_reason or ("tool_use" if self.tool_blocks else "end_turn")
        inputs = sum(self.usage.get(key, 0) for key in _INPUT_FIELDS)
        return StreamEnd(stop, Usage(inputs, self.usage.get("output_tokens", 0)))


_INPUT_FIELDS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
"""Anthropic counts input in three fields; wakeful's ``input_tokens`` is their sum."""


class AnthropicMessages(HTTPProvider):
    """Streams turns from ``{base_url}/v1/messages``.

    ``model`` is used when the request's own ``model`` is empty. ``api_key`` defaults to
    ``$ANTHROPIC_API_KEY``. ``version`` is the ``anthropic-version`` header. ``headers`` are
    added to every request (``anthropic-beta`` ...) and ``extra_body`` is merged into every
    body (``top_k``, ``metadata`` ...). ``client`` is borrowed and never closed; otherwise the
    adapter owns one: use ``async with`` or ``aclose()``. ``limits``: rate limits
    (``wakeful.limits.RateLimit``) an agent's every call to this provider takes from, shared
    by every worker on the store."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str = "https://api.anthropic.com",
        api_key: str | None = None,
        client: httpx.AsyncClient | None = None,
        version: str = "2023-06-01",
        timeout: TimeoutLike | None = None,
        headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        limits: RateLimit | Sequence[RateLimit] | None = None,
    ) -> None:
        super().__init__(client=client, timeout=timeout)
        self.limits = check_limits(limits)
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.version = version
        self._api_key = api_key if api_key is not None else os.environ.get("ANTHROPIC_API_KEY")
        self._headers = dict(headers or {})
        self._extra_body = dict(extra_body or {})

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body sent for ``request``. Raises ``ProviderError("invalid_request")`` if
        a recorded tool call's arguments are not a JSON object."""
        system, messages = wire_messages(request.messages)
        if request.system:
            system.insert(0, request.system)
        body: dict[str, Any] = {
            "model": request.model or self.model,
            "max_tokens": request.max_tokens,
            "messages": messages,
            "stream": True,
        }
        if system:
            body["system"] = "\n\n".join(system)
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.tools:
            body["tools"] = [
                {
                    "name": tool.name,
                    **({"description": tool.description} if tool.description else {}),
                    "input_schema": tool.parameters,
                }
                for tool in request.tools
            ]
        body.update(self._extra_body)
        return body

    def _request_headers(self) -> dict[str, str]:
        headers = {"anthropic-version": self.version}
        if self._api_key:
            headers["x-api-key"] = self._api_key
        return {**headers, **self._headers}

    async def stream(
        self, request: ModelRequest, *, observation: Observation | None = None
    ) -> AsyncGenerator[StreamItem, None]:
        """Yield the turn's deltas, then one ``StreamEnd`` at ``message_stop``. An ``error``
        event raises its classified ``ProviderError``; a stream that ends or breaks before
        ``message_stop`` raises ``ProviderError("connection")`` (or ``timeout``) after the
        deltas that did arrive. ``observation``, if given, records the exchange."""
        events = _Events()
        url = f"{self.base_url}/v1/messages"
        async with self._post_stream(
            url, self.request_body(request), self._request_headers(), observation
        ) as exchange:
            reset = exchange.limit_reset()
            async for event in aiter_sse(exchange.aiter_bytes()):
                if observation is not None:
                    observation.events += 1
                data = decode_json(event.data)
                if not isinstance(data, dict):
                    raise ProviderError("server", "malformed stream event: not an object")
                kind = data.get("type")
                for item in events.feed(kind if isinstance(kind, str) else event.event, data):
                    yield item
                if events.done:
                    break
            if not events.done:
                raise truncated("message_stop")
        end = events.end()
        yield end if reset is None else msgspec.structs.replace(end, limit_reset=reset)
