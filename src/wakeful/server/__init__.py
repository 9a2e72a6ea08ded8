"""The HTTP API (FastAPI): ``create_app``, ``serve``, ``load_tokens`` and ``Metrics``.

Importing this package does not import FastAPI; ``wakeful.metrics`` stays usable
without the ``server`` extra (a worker counts into the same ``Metrics``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wakeful.metrics import Metrics
    from wakeful.server.app import create_app
    from wakeful.server.auth import load_tokens
    from wakeful.server.runner import Server, run_server, serve

_LAZY = {
    "create_app": "wakeful.server.app",
    "load_tokens": "wakeful.server.auth",
    "Metrics": "wakeful.metrics",
    "Server": "wakeful.server.runner",
    "run_server": "wakeful.server.runner",
    "serve": "wakeful.server.runner",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'wakeful.server' has no attribute {name!r}")


__all__ = ["Metrics", "Server", "create_app", "load_tokens", "run_server", "serve"]
