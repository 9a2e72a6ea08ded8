"""Model providers: the streaming protocol, typed errors and adapters.

``Scripted`` plays scripted turns for tests and demos (with ``Fail``, ``Drop`` and ``Stall``
to inject failures). The HTTP adapters (``OpenAIChat``, ``AnthropicMessages``) are imported
on first access, so importing this package does not import httpx."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from wakeful.providers.base import (
    MAX_RETRY_AFTER,
    ErrorKind,
    ModelRequest,
    Provider,
    ProviderError,
    StreamEnd,
    StreamItem,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    Usage,
)
from wakeful.providers.scripted import Drop, Fail, Scripted, Stall

if TYPE_CHECKING:
    from wakeful.providers.anthropic import AnthropicMessages
    from wakeful.providers.openai import OpenAIChat

_LAZY = {
    "AnthropicMessages": "wakeful.providers.anthropic",
    "OpenAIChat": "wakeful.providers.openai",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:
        if exc.name != "httpx":
            raise
        raise ImportError(f"{name} needs httpx: pip install httpx") from exc
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "MAX_RETRY_AFTER",
    "AnthropicMessages",
    "Drop",
    "ErrorKind",
    "Fail",
    "ModelRequest",
    "OpenAIChat",
    "Provider",
    "ProviderError",
    "Scripted",
    "Stall",
    "StreamEnd",
    "StreamItem",
    "TextDelta",
    "ToolCallDelta",
    "ToolSpec",
    "Usage",
]
