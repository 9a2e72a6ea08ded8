"""Stores: the contract and its backends, opened by URL."""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Generator
from typing import Any
from urllib.parse import urlsplit

from wakeful.clock import Clock
from wakeful.errors import UnsupportedStore
from wakeful.store.contract import DispatchQueue, Outbox, Store, StreamCheckpointStore, ThreadStore

SCHEMES = ("memory", "file", "sqlite", "postgresql", "postgres")


class StoreOpening(Awaitable[Store]):
    """What ``open_store`` returns: await it for the store, or use it with ``async with``
    to close the store on exit."""

    def __init__(self, url: str, clock: Clock | None, options: dict[str, Any]) -> None:
        self._url = url
        self._clock = clock
        self._options = options
        self._store: Store | None = None

    def __await__(self) -> Generator[Any, None, Store]:
        return _open(self._url, self._clock, self._options).__await__()

    async def __aenter__(self) -> Store:
        self._store = await _open(self._url, self._clock, self._options)
        return self._store

    async def __aexit__(self, *exc: object) -> None:
        if self._store is not None:
            await self._store.close()


def open_store(url: str, *, clock: Clock | None = None, **options: Any) -> StoreOpening:
    """Open the store named by ``url``. Await the result, or use it with ``async with``
    (which closes the store on exit).

    Schemes:
      - ``memory://``: the reference backend; nothing survives the process.
      - ``file:///abs/dir``: one process (enforced by an OS lock), an fsynced commit log.
      - ``sqlite:///relative.db`` / ``sqlite:////abs/file.db``: many processes on one host.
      - ``postgresql://...``: a fleet; time is the server's ``now()``.

    ``clock`` is how memory, file and SQLite stores judge claim and lease expiry (default:
    the system clock). Backends beyond memory are imported lazily, so their extras are only
    needed when used.

    The store implements the whole contract of ``wakeful.store.contract.Store``: fenced claims
    on threads (at most one live claim per thread; tokens strictly increase), atomic commits
    checked in a fixed order (stale token, operation replay, version, consistency), durable
    numbered events, the dispatch queue, inbox/outbox and stream checkpoints.
    """
    if not isinstance(url, str):
        raise UnsupportedStore(repr(url), "the store URL must be a string")
    return StoreOpening(url, clock, options)


_BACKENDS = {
    "file": ("wakeful.store.file", "open_file_store", None),
    "sqlite": ("wakeful.store.sqlite", "open_sqlite_store", None),
    "postgresql": ("wakeful.store.postgres", "open_postgres_store", "postgres"),
    "postgres": ("wakeful.store.postgres", "open_postgres_store", "postgres"),
}
"""scheme -> (module, opener, extra). Imported only when a URL names the scheme."""


async def _open(url: str, clock: Clock | None, options: dict[str, Any]) -> Store:
    scheme = urlsplit(url).scheme.lower()
    if scheme == "memory":
        if options:
            raise UnsupportedStore(url, f"memory:// takes no options, got {sorted(options)}")
        from wakeful.store.memory import MemoryStore

        return MemoryStore(clock)
    if scheme not in _BACKENDS:
        raise UnsupportedStore(url, f"unknown scheme {scheme!r}; use one of {', '.join(SCHEMES)}")
    module_name, opener_name, extra = _BACKENDS[scheme]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.startswith("wakeful"):
            raise UnsupportedStore(url, f"the {scheme} backend is not in this version") from exc
        hint = f"; install it with: pip install 'wakeful[{extra}]'" if extra else ""
        raise UnsupportedStore(url, f"the {scheme} backend needs {exc.name}{hint}") from exc
    opener = getattr(module, opener_name)
    store: Store = await opener(url, clock=clock, **options)
    return store


__all__ = [
    "DispatchQueue",
    "Outbox",
    "Store",
    "StoreOpening",
    "StreamCheckpointStore",
    "ThreadStore",
    "open_store",
]
