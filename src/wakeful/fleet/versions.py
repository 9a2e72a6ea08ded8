"""A worker's code version (issue 40): what a run records it started on, and what the
worker registry lists, so that a deploy can tell old code from new.

The default version is a hash of what the worker would run: every registered target's
name, graph structure (``CompiledGraph.fingerprint``) and declared patches, and the source
files of the modules that define its nodes, routers and tools (and any module named in
``modules``, such as the ``--app`` module). An unchanged deploy keeps its version; a change
to any of those files makes a new one. Name versions yourself (``Worker(version=...)``,
``wakeful worker --version``) when you want them to follow your release numbers."""

from __future__ import annotations

import hashlib
import inspect
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from wakeful.fleet.registry import Registry
from wakeful.ids import check_id
from wakeful.metrics import Metrics

VERSION_PREFIX = "code-"


def code_version(registry: Registry, modules: Iterable[str] = ()) -> str:
    """``code-`` and 16 hex digits of the hash described in the module docstring."""
    digest = hashlib.sha256()
    files: set[Path | None] = set()
    for target in registry.targets():
        graph = target.graph
        patches = ",".join(graph.patches)
        digest.update(f"{target.name}\0{graph.name}\0{graph.fingerprint}\0{patches}\0".encode())
        functions: list[Any] = [spec.fn for spec in graph.nodes.values()]
        functions += [router for router, _ in graph.graph.routers.values()]
        if target.agent is not None:
            functions += [tool.fn for tool in target.agent.tools.values()]
        files.update(_source(fn) for fn in functions)
    for name in modules:
        module = sys.modules.get(name)
        files.add(_source(module) if module is not None else None)
    for path in sorted(p for p in files if p is not None):
        digest.update(str(path.name).encode() + b"\0")
        try:
            digest.update(path.read_bytes())
        except OSError:  # a source that went away: its name still counts
            continue
    return VERSION_PREFIX + digest.hexdigest()[:16]


def worker_version(version: str | None, registry: Registry, metrics: Metrics) -> str:
    """A worker's version: ``version`` checked, else ``code_version(registry)``; announced
    on the worker's ``/metrics`` as ``wakeful_worker_info{version="..."} 1``."""
    chosen = check_id("version", version) if version is not None else code_version(registry)
    info = metrics.live_gauge(
        "wakeful_worker_info", "This worker process, by the code version it runs.", ("version",)
    )
    info.inc(version=chosen)
    return chosen


def _source(obj: Any) -> Path | None:
    """The source file that defines ``obj`` (a function, method, callable object or
    module), or ``None`` (a builtin, code typed into a REPL)."""
    target = getattr(obj, "__func__", obj)
    if not (inspect.ismodule(target) or inspect.isfunction(target)):
        target = type(target)
    try:
        found = inspect.getsourcefile(target)
    except TypeError:
        return None
    return Path(found) if found else None


__all__ = ["code_version", "worker_version"]
