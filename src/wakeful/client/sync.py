"""``SyncClient``: the same client for code without an event loop.

It runs an ``asyncio`` loop in one background thread and the ``Client`` on it, so both
behave the same (retries, idempotency keys, errors, reconnecting streams). Groups and
methods mirror ``Client``'s; a stream is a plain iterator of ``Frame``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator, Mapping
from typing import Any, TypeVar

from wakeful.client.client import Client
from wakeful.client.streams import Backoff, Frame, MessageAssembler, Stream

T = TypeVar("T")


class _Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="wakeful-client", daemon=True
        )
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.run(self.loop.shutdown_asyncgens())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class SyncStream:
    """A ``Stream`` as a blocking iterator; ``close()`` ends it."""

    def __init__(self, loop: _Loop, stream: Stream) -> None:
        self._loop = loop
        self._stream = stream
        self._frames = stream.__aiter__()

    @property
    def messages(self) -> MessageAssembler:
        return self._stream.messages

    @property
    def last_id(self) -> str | None:
        return self._stream.last_id

    def __iter__(self) -> Iterator[Frame]:
        return self

    def __next__(self) -> Frame:
        try:
            return self._loop.run(_next(self._frames))
        except StopAsyncIteration:
            raise StopIteration from None

    def __enter__(self) -> SyncStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._loop.run(_aclose(self._frames, self._stream))


async def _next(frames: Any) -> Frame:
    frame: Frame = await frames.__anext__()
    return frame


async def _aclose(frames: Any, stream: Stream) -> None:
    await frames.aclose()
    await stream.close()


class _SyncGroup:
    def __init__(self, loop: _Loop, group: Any) -> None:
        self._loop = loop
        self._group = group

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._group, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            if isinstance(result, Stream):
                return SyncStream(self._loop, result)
            return self._loop.run(result)

        call.__doc__ = method.__doc__
        return call


class SyncClient:
    """``SyncClient(base_url, token=None)``; use ``with`` or ``close()``. Its groups
    (``threads``, ``runs``, ``messages``, ``events``, ``dispatches``, ``workers``,
    ``schedules``, ``quarantine``) have ``Client``'s methods, blocking."""

    threads: _SyncGroup
    runs: _SyncGroup
    messages: _SyncGroup
    events: _SyncGroup
    dispatches: _SyncGroup
    workers: _SyncGroup
    quarantine: _SyncGroup

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        backoff: Backoff | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._loop = _Loop()
        self._client = self._loop.run(_make(base_url, token, timeout, backoff, headers))
        groups = ("threads", "runs", "messages", "events", "dispatches", "workers", "schedules")
        for name in groups:
            setattr(self, name, _SyncGroup(self._loop, getattr(self._client, name)))
        self.quarantine = _SyncGroup(self._loop, self._client.quarantine)

    def stream(self, thread_id: str, **options: Any) -> SyncStream:
        return SyncStream(self._loop, self._client.stream(thread_id, **options))

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._loop.run(self._client.aclose())
        self._loop.stop()


async def _make(
    base_url: str,
    token: str | None,
    timeout: float,
    backoff: Backoff | None,
    headers: Mapping[str, str] | None,
) -> Client:
    return Client(base_url, token, timeout=timeout, backoff=backoff, headers=headers)


__all__ = ["SyncClient", "SyncStream"]
