"""A local OpenAI-compatible chat server that answers from the request, for the examples and
the documentation's code blocks (``tests/provider_server.py`` scripts replies one by one;
this one behaves like a small, predictable model).

Each request is answered from the conversation since its last user message: each tool
named in ``tool_arguments`` (in that order) that the request offers and the conversation has
not called yet is called with those arguments, one per turn; then, after a tool result, a
short final answer quoting it; otherwise ``answer``. Replies pushed with ``push`` go
first."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tests.provider_server import ProviderServer, Reply, openai_chunk, openai_text, openai_tool


class ChatServer(ProviderServer):
    def __init__(
        self,
        tool_arguments: Mapping[str, Any] | None = None,
        answer: str = "Hello from the local model.",
    ) -> None:
        super().__init__()
        self.tool_arguments = dict(tool_arguments or {})
        self.answer = answer

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def _next(self) -> Reply:
        with self._lock:
            if self.replies:
                return self.replies.popleft()
            body = self.received[-1].body if self.received else None
        return Reply(events=self.respond(body if isinstance(body, dict) else {}))

    def respond(self, body: dict[str, Any]) -> list[bytes]:
        messages = body.get("messages") or [{}]
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        since = messages[users[-1] :] if users else messages
        called = {
            call.get("function", {}).get("name")
            for m in since
            if m.get("role") == "assistant"
            for call in m.get("tool_calls") or []
        }
        offered = {t.get("function", {}).get("name") for t in body.get("tools") or []}
        pending = [n for n in self.tool_arguments if n in offered and n not in called]
        if pending:
            name = pending[0]
            return [
                openai_chunk({"role": "assistant", "content": None}),
                openai_tool(
                    0, f"call_{len(called) + 1}", name, json.dumps(self.tool_arguments[name])
                ),
                openai_chunk({}, "tool_calls"),
                b"data: [DONE]\n\n",
            ]
        last = messages[-1]
        if last.get("role") == "tool":
            return openai_text("Done: ", str(last.get("content", ""))[:200])
        return openai_text(self.answer)
