"""An adapter for any OpenAI-compatible Chat Completions server (OpenAI, Azure-style
gateways, vLLM, llama.cpp, Ollama, LiteLLM, OpenRouter ...), over plain HTTP with server-sent
events. No SDK, no retries."""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

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
    reports_error,
    truncated,
)
from wakeful.providers.sse import aiter_sse
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


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class _Chunks:
    """Turns decoded ``chat.completion.chunk`` objects into stream items, absorbing the
    dialects of compatible servers (see docs/providers.md, "Servers"). A reported failure is
    kept in ``error`` for the caller to raise after the chunk's items."""

    def __init__(self, observation: Observation | None = None) -> None:
        self.calls: dict[int, _Call] = {}
        self.count = 0
        self.last_wire_index = 0
        self.finish: str | None = None
        self.usage: Usage | None = None
        self.error: ProviderError | None = None
        self._observation = observation

    def note(self, workaround: str) -> None:
        if self._observation is not None:
            self._observation.worked_around(workaround)

    def feed(self, chunk: Any) -> list[StreamItem]:
        if not isinstance(chunk, dict):
            raise ProviderError("server", "malformed stream chunk: not an object")
        if reports_error(chunk):
            # OpenRouter sends its error object beside a choice with finish_reason "error";
            # others (OpenAI, vLLM, SGLang, Ollama) without choices.
            self.error = error_from_event(chunk)
        self._usage(chunk)
        choices = chunk.get("choices")
        if not choices and ("prompt_filter_results" in chunk or "prompt_annotations" in chunk):
            self.note("skipped Azure's content-filter chunk with empty choices")
        items: list[StreamItem] = []
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # wakeful asks for one choice
            delta = choice.get("delta")
            if isinstance(delta, dict):
                items.extend(self._delta(delta))
            elif "content_filter_results" in choice:
                self.note("skipped Azure's content-filter annotations without a delta")
            reason = choice.get("finish_reason")
            if reason == "error":
                self.error = self.error or ProviderError(
                    "server", 'the server ended the turn with finish_reason "error"'
                )
            elif isinstance(reason, str) and reason:
                self.finish = FINISH_REASONS.get(reason, reason)
        return items

    def _delta(self, delta: dict[str, Any]) -> list[StreamItem]:
        items: list[StreamItem] = []
        content = delta.get("content")
        if isinstance(content, str) and content:
            items.append(TextDelta(content))
        if any(
            isinstance(delta.get(k), str) and delta[k] for k in ("reasoning", "reasoning_content")
        ):
            self.note("left out reasoning text sent beside content (reasoning, reasoning_content)")
        tool_calls = delta.get("tool_calls")
        for fragment in tool_calls if isinstance(tool_calls, list) else ():
            if isinstance(fragment, dict):
                item = self._tool_fragment(fragment)
                if item is not None:
                    items.append(item)
        return items

    def _usage(self, chunk: dict[str, Any]) -> None:
        usage = chunk.get("usage")
        if not isinstance(usage, dict):
            groq = chunk.get("x_groq")
            usage = groq.get("usage") if isinstance(groq, dict) else None
            if isinstance(usage, dict):
                self.note("read usage from Groq's x_groq.usage")
        if isinstance(usage, dict):
            self.usage = Usage(
                input_tokens=_count(usage.get("prompt_tokens")),
                output_tokens=_count(usage.get("completion_tokens")),
            )

    def _tool_fragment(self, fragment: dict[str, Any]) -> ToolCallDelta | None:
        # Calls are told apart by the wire index, or by a new id at the same index (Ollama
        # sends every call at index 0; its older versions, and others, send no index).
        wire_index = fragment.get("index")
        if not isinstance(wire_index, int):
            self.note("numbered tool calls sent without an index")
            wire_index = self.last_wire_index
        self.last_wire_index = wire_index
        function = fragment.get("function")
        function = function if isinstance(function, dict) else {}
        call_id = fragment.get("id") if isinstance(fragment.get("id"), str) else None
        name = function.get("name") if isinstance(function.get("name"), str) else None
        arguments = function.get("arguments")
        if isinstance(arguments, dict):
            self.note("encoded tool arguments sent as a JSON object instead of text")
            arguments = msgspec.json.encode(arguments).decode()
        arguments = arguments if isinstance(arguments, str) else ""
        call = self.calls.get(wire_index)
        if call is None or (call_id and call.id and call_id != call.id):
            if call is not None:
                self.note("told apart tool calls sharing an index by their ids")
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
        if stop == "end_turn" and self.count:
            self.note('read finish_reason "stop" after tool calls as tool_use')
            stop = "tool_use"
        return StreamEnd(stop, self.usage)


def _error_event(data: str) -> ProviderError:
    """An SSE event named ``error`` (llama.cpp's ``error:`` field, LM Studio's ``event:
    error``): its data is an error body, a bare error object or plain text."""
    try:
        body = msgspec.json.decode(data)
    except msgspec.DecodeError:
        body = data
    return error_from_event(body if reports_error(body) else {"error": body})


class OpenAIChat(HTTPProvider):
    """Streams turns from ``{base_url}/chat/completions``.

    ``model`` is used when the request's own ``model`` is empty. ``api_key`` defaults to
    ``$OPENAI_API_KEY``; with neither, no ``Authorization`` header is sent (local servers).
    ``headers`` are added to every request and ``extra_body`` is merged into every body
    (``top_p``, ``seed``, ``reasoning_effort`` ...). ``max_tokens_param`` names the limit
    field: ``"max_completion_tokens"`` for OpenAI's reasoning models. ``params`` are added to
    the URL's query (Azure's ``api-version``). ``client`` is borrowed
    and never closed; otherwise the adapter owns one: use ``async with`` or ``aclose()``.
    ``limits``: rate limits (``wakeful.limits.RateLimit``) an agent's every call to this
    provider takes from, shared by every worker on the store."""

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
        params: Mapping[str, str] | None = None,
        limits: RateLimit | Sequence[RateLimit] | None = None,
    ) -> None:
        super().__init__(client=client, timeout=timeout)
        self.limits = check_limits(limits)
        self._params = dict(params or {})
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

    async def stream(
        self, request: ModelRequest, *, observation: Observation | None = None
    ) -> AsyncGenerator[StreamItem, None]:
        """Yield the turn's deltas, then one ``StreamEnd``. The turn is complete at
        ``data: [DONE]``, or at the end of the body once a ``finish_reason`` has arrived (the
        usage chunk may then be missing); a stream that ends or breaks before either raises
        ``ProviderError("connection")`` after the deltas that did arrive. An error reported
        inside the stream (an ``error`` object in any chunk, ``finish_reason: "error"``, an
        ``error`` event) raises its classified ``ProviderError``, never a ``StreamEnd``.
        ``observation``, if given, records the exchange for diagnostics."""
        chunks = _Chunks(observation)
        reset: float | None = None
        url = f"{self.base_url}/chat/completions"
        try:
            async with self._post_stream(
                url,
                self.request_body(request),
                self._request_headers(),
                observation,
                params=self._params,
            ) as exchange:
                reset = exchange.limit_reset()
                async for event in aiter_sse(exchange.aiter_bytes()):
                    if observation is not None:
                        observation.events += 1
                    if event.event == "error":
                        chunks.note("read an SSE error event (event: error, or error:) as an error")
                        raise _error_event(event.data)
                    if event.data.strip() == "[DONE]":
                        break
                    for item in chunks.feed(decode_json(event.data)):
                        yield item
                    if chunks.error is not None:
                        raise chunks.error
                else:
                    if chunks.finish is None:
                        raise truncated("finish_reason or [DONE]")
                    chunks.note("took the end of the body after finish_reason as the end")
        except ProviderError as exc:
            if chunks.finish is None or exc.kind not in ("connection", "timeout"):
                raise
            chunks.note("took a cut after finish_reason as the end (usage may be missing)")
        end = chunks.end()
        yield end if reset is None else msgspec.structs.replace(end, limit_reset=reset)
