"""A local OpenAI-compatible chat server that answers from the request, for the examples and
the documentation's code blocks (``tests/provider_server.py`` scripts replies one by one;
this one behaves like a small, predictable model).

Each request is answered by its last message: after a tool result, a short final answer
quoting it; when the request offers a tool named in ``tool_arguments``, a call of that tool
with those arguments (once per user message: a tool result after it means the next answer
is final); otherwise ``answer``. Replies pushed with ``push`` go first."""

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
        last = messages[-1]
        if last.get("role") == "tool":
            return openai_text("Done: ", str(last.get("content", ""))[:200])
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        since = messages[users[-1] :] if users else messages
        called = any(m.get("role") == "tool" for m in since)
        offered = [t.get("function", {}).get("name") for t in body.get("tools") or []]
        wanted = [name for name in offered if name in self.tool_arguments]
        if wanted and not called:
            name = wanted[0]
            arguments = json.dumps(self.tool_arguments[name])
            return [
                openai_chunk({"role": "assistant", "content": None}),
                openai_tool(0, "call_1", name, arguments),
                openai_chunk({}, "tool_calls"),
                b"data: [DONE]\n\n",
            ]
        return openai_text(self.answer)
