"""The memory store: the reference backend, for tests and single-process embedding.

Nothing survives the process. All state lives in one ``State`` projection mutated only from
the event loop that uses the store; use one store per event loop.
"""

from __future__ import annotations

import msgspec

from wakeful.clock import Clock
from wakeful.errors import StreamCheckpointError, WakefulError
from wakeful.ids import check_id
from wakeful.records import StreamCheckpoint
from wakeful.store.buckets import ProcessBuckets
from wakeful.store.projected import ProjectedStore
from wakeful.store.validate import check_discard, check_stream_checkpoint, discards


class InjectedCrash(Exception):
    """Raised at an armed fault point, as if the process had died there."""


class MemoryStore(ProjectedStore, ProcessBuckets):
    """The whole contract in memory. ``crash_at(point)`` arms a one-shot fault for tests
    (points: ``"relay.after_append"``)."""

    def __init__(self, clock: Clock | None = None) -> None:
        super().__init__(clock)
        self._armed: set[str] = set()
        self._stream = MemoryStreamCheckpoints(self)

    @property
    def stream_checkpoints(self) -> MemoryStreamCheckpoints:
        return self._stream

    def crash_at(self, point: str) -> None:
        self._armed.add(point)

    def _fault(self, point: str) -> None:
        if point in self._armed:
            self._armed.discard(point)
            raise InjectedCrash(point)

    async def delete_thread(self, thread_id: str) -> None:
        await super().delete_thread(thread_id)
        self._stream.drop_thread(thread_id)


class MemoryStreamCheckpoints:
    """Stream checkpoints in a dict, fenced by the owning store's claims."""

    def __init__(self, store: ProjectedStore) -> None:
        self._store = store
        self._items: dict[str, StreamCheckpoint] = {}

    async def get(self, run_id: str) -> StreamCheckpoint | None:
        _checked_run_id(run_id)
        return self._items.get(run_id)

    async def put(self, checkpoint: StreamCheckpoint) -> None:
        try:
            copy = check_stream_checkpoint(checkpoint)
        except WakefulError as exc:
            raise StreamCheckpointError(
                getattr(checkpoint, "run_id", "?"), "invalid", str(exc)
            ) from exc
        claim = self._store.current_claim(copy.thread_id)
        if claim is None or claim.token != copy.token:
            raise StreamCheckpointError(
                copy.run_id,
                "stale",
                f"token {copy.token} is not the current claim of thread {copy.thread_id!r}",
            )
        if copy.updated_at is None:
            copy = msgspec.structs.replace(copy, updated_at=self._store.now())
        self._items[copy.run_id] = copy

    async def delete(self, run_id: str) -> None:
        _checked_run_id(run_id)
        self._items.pop(run_id, None)

    async def discard(self, run_id: str, task_id: str, token: int) -> None:
        check_discard(run_id, task_id, token)
        if discards(self._items.get(run_id), task_id, token):
            del self._items[run_id]

    def drop_thread(self, thread_id: str) -> None:
        for run_id in [r for r, c in self._items.items() if c.thread_id == thread_id]:
            del self._items[run_id]


def _checked_run_id(run_id: str) -> str:
    try:
        return check_id("run_id", run_id)
    except WakefulError as exc:
        raise StreamCheckpointError(str(run_id)[:40], "invalid", str(exc)) from exc
