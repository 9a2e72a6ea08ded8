"""An adapter for any OpenAI-compatible Chat Completions server (OpenAI, Azure-style
gateways, vLLM, llama.cpp, Ollama, LiteLLM, OpenRouter ...), over plain HTTP with server-sent
events. No SDK, no retries."""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import httpx
import msgspec

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
    TimeoutLike,
    aiter_sse,
    decode_json,
    error_from_event,
    truncated,
)
from wakeful.records import Message

FINISH_REASONS: Final[Mapping[str, str]] = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
}
"""``finish_reason`` to wakeful's ``stop_reason``; others (``content_filter``) pass through."""


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return "" if value is None else msgspec.json.encode(value).decode()


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else msgspec.json.encode(value or {}).decode()


def wire_message(message: Message) -> dict[str, Any]:
    """One wakeful ``Message`` as a Chat Completions message."""
    if message.role == "tool":
        return {
            "role": "tool",
            "tool_call_id": message.tool_call_id,
            "content": _text(message.content),
        }
    if message.role == "assistant":
        wire: dict[str, Any] = {"role": "assistant"}
        if message.tool_calls:
            wire["content"] = _text(message.content) or None
            wire["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": _arguments(call["arguments"])},
                }
                for call in message.tool_calls
            ]
        else:
            wire["content"] = _text(message.content)
        return wire
    # user and system content may already be a list of content parts (images ...)
    content = message.content if isinstance(message.content, list) else _text(message.content)
    return {"role": message.role, "content": content}


@dataclass(slots=True)
class _Call:
    index: int
    id: str | None
    named: bool


class _Chunks:
    """Turns decoded ``chat.completion.chunk`` objects into stream items."""

    def __init__(self) -> None:
        self.calls: dict[int, _Call] = {}
        self.count = 0
        self.last_wire_index = 0
        self.finish: str | None = None
        self.usage: Usage | None = None

    def feed(self, chunk: Any) -> list[StreamItem]:
        if not isinstance(chunk, dict):
            raise ProviderError("server", "malformed stream chunk: not an object")
        if chunk.get("error") is not None and not chunk.get("choices"):
            raise error_from_event(chunk)
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = Usage(
                input_tokens=int(usage.get("prompt_tokens") or 0),
                output_tokens=int(usage.get("completion_tokens") or 0),
            )
        items: list[StreamItem] = []
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # wakeful asks for one choice
            delta = choice.get("delta")
            if isinstance(delta, dict):
                content = delta.get("content")
                if isinstance(content, str) and content:
                    items.append(TextDelta(content))
                for fragment in delta.get("tool_calls") or ():
                    if isinstance(fragment, dict):
                        item = self._tool_fragment(fragment)
                        if item is not None:
                            items.append(item)
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                self.finish = FINISH_REASONS.get(reason, reason)
        return items

    def _tool_fragment(self, fragment: dict[str, Any]) -> ToolCallDelta | None:
        # Calls are told apart by the wire index, or by a new id at the same index (some
        # compatible servers send every call at index 0). Ours count calls from 0.
        wire_index = fragment.get("index")
        if not isinstance(wire_index, int):
            wire_index = self.last_wire_index
        self.last_wire_index = wire_index
        function = fragment.get("function")
        function = function if isinstance(function, dict) else {}
        call_id = fragment.get("id") if isinstance(fragment.get("id"), str) else None
        name = function.get("name") if isinstance(function.get("name"), str) else None
        arguments = function.get("arguments")
        arguments = arguments if isinstance(arguments, str) else ""
        call = self.calls.get(wire_index)
        if call is None or (call_id and call.id and call_id != call.id):
            call = self.calls[wire_index] = _Call(self.count, None, False)
            self.count += 1
        new_id = call_id if call_id and call.id is None else None
        new_name = name if name and not call.named else None
        if new_id:
            call.id = new_id
        if new_name:
            call.named = True
        if new_id is None and new_name is None and not arguments:
            return None
        return ToolCallDelta(call.index, id=new_id, name=new_name, arguments=arguments)

    def end(self) -> StreamEnd:
        stop = self.finish or ("tool_use" if self.count else "end_turn")
        return StreamEnd(stop, self.usage)


class OpenAIChat(HTTPProvider):
    """Streams turns from ``{base_url}/chat/completions``.

    ``model`` is used when the request's own ``model`` is empty. ``api_key`` defaults to
    ``$OPENAI_API_KEY``; with neither, no ``Authorization`` header is sent (local servers).
    ``headers`` are added to every request and ``extra_body`` is merged into every body
    (``top_p``, ``seed``, ``reasoning_effort`` ...). ``max_tokens_param`` names the limit
    field: ``"max_completion_tokens"`` for OpenAI's reasoning models. ``client`` is borrowed
    and never closed; otherwise the adapter owns one: use ``async with`` or ``aclose()``."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str = "https://api.openai.com/v1",
        api_key: str | None = None,
        client: httpx.AsyncClient | None = None,
        timeout: TimeoutLike | None = None,
        headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_tokens_param: str = "max_tokens",
    ) -> None:
        super().__init__(client=client, timeout=timeout)
        self.model = model
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self._headers = dict(headers or {})
        self._extra_body = dict(extra_body or {})
        self._max_tokens_param = max_tokens_param

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body sent for ``request``."""
        messages: list[dict[str, Any]] = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        messages.extend(wire_message(m) for m in request.messages)
        body: dict[str, Any] = {
            "model": request.model or self.model,
            "messages": messages,
            self._max_tokens_param: request.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        **({"description": tool.description} if tool.description else {}),
                        "parameters": tool.parameters,
                    },
                }
                for tool in request.tools
            ]
        body.update(self._extra_body)
        return body

    def _request_headers(self) -> dict[str, str]:
        headers = {"authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        return {**headers, **self._headers}

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamItem, None]:
        """Yield the turn's deltas, then one ``StreamEnd``. The turn is complete at
        ``data: [DONE]``, or at the end of the body once a ``finish_reason`` has arrived (the
        usage chunk may then be missing); a stream that ends or breaks before either raises
        ``ProviderError("connection")`` after the deltas that did arrive."""
        chunks = _Chunks()
        url = f"{self.base_url}/chat/completions"
        try:
            async with self._post_stream(
                url, self.request_body(request), self._request_headers()
            ) as response:
                async for event in aiter_sse(response.aiter_bytes()):
                    if event.data.strip() == "[DONE]":
                        break
                    for item in chunks.feed(decode_json(event.data)):
                        yield item
                else:
                    if chunks.finish is None:
                        raise truncated("finish_reason or [DONE]")
        except ProviderError as exc:
            if chunks.finish is None or exc.kind not in ("connection", "timeout"):
                raise
        yield chunks.end()
