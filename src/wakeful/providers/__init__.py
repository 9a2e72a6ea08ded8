"""Model providers: the streaming protocol, typed errors and adapters."""

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

__all__ = [
    "MAX_RETRY_AFTER",
    "ErrorKind",
    "ModelRequest",
    "Provider",
    "ProviderError",
    "StreamEnd",
    "StreamItem",
    "TextDelta",
    "ToolCallDelta",
    "ToolSpec",
    "Usage",
]
