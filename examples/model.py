"""The model every example uses: any OpenAI-compatible Chat Completions endpoint, configured
by the environment (the test suite points it at a local server):

- ``OPENAI_BASE_URL`` (default ``https://api.openai.com/v1``),
- ``OPENAI_API_KEY`` (sent as a bearer token when set),
- ``WAKEFUL_MODEL`` (default ``gpt-4o-mini``)."""

from __future__ import annotations

import os

from wakeful.providers import ModelRequest, OpenAIChat, TextDelta
from wakeful.records import Message


def chat_model() -> OpenAIChat:
    return OpenAIChat(
        os.environ.get("WAKEFUL_MODEL", "gpt-4o-mini"),
        base_url=os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1"),
    )


async def ask(model: OpenAIChat, system: str, prompt: str, ident: str) -> str:
    """One plain completion (no tools): the streamed text, joined. ``ident`` names the
    message (unique per call)."""
    request = ModelRequest(
        model="",
        system=system,
        messages=(Message(id=ident, role="user", content=prompt),),
        max_tokens=400,
    )
    parts = [item.text async for item in model.stream(request) if isinstance(item, TextDelta)]
    return "".join(parts).strip()
