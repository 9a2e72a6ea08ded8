"""The HTTP API's Python client: ``Client`` (async) and ``SyncClient``.

It knows the routes, not the server's code. See ``docs/client.md``.
"""

from __future__ import annotations

from wakeful.client.client import Client
from wakeful.client.problems import error_for
from wakeful.client.streams import AssembledMessage, Backoff, Frame, MessageAssembler, Stream
from wakeful.client.sync import SyncClient, SyncStream

__all__ = [
    "AssembledMessage",
    "Backoff",
    "Client",
    "Frame",
    "MessageAssembler",
    "Stream",
    "SyncClient",
    "SyncStream",
    "error_for",
]
