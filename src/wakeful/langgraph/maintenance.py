"""The saver's whole-thread maintenance: ``delete_for_runs``, ``copy_thread``, ``prune``.

Each builds one record from the thread's complete index (``WakefulSaver._write`` folds a
partial one from the whole history first) and commits it fenced, as every write.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from wakeful.errors import InvalidInput
from wakeful.langgraph.codec import store_thread_id
from wakeful.langgraph.index import CheckpointKey, ThreadIndex
from wakeful.langgraph.sync import SyncMethods

Built = tuple[list[dict[str, Any]], list[str]] | None
"""What a write builds from the thread's index: the new record's items and the records it
drops, or ``None`` for nothing to write."""


class Maintenance(SyncMethods):
    """Mixed into ``WakefulSaver`` (which defines the methods declared here)."""

    def _bind(self, thread: str) -> str:
        raise NotImplementedError

    async def _complete(self, thread: str) -> ThreadIndex:
        raise NotImplementedError

    def _threads(self, lg_thread: str | None) -> AsyncIterator[tuple[str, ThreadIndex]]:
        raise NotImplementedError

    async def _write(self, lg_thread: str, build: Callable[[ThreadIndex], Built]) -> None:
        raise NotImplementedError

    def _metadata(self, item: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Remove the checkpoints whose metadata names one of ``run_ids`` (and their
        writes) from every thread of the store. Reads every LangGraph thread once."""
        runs = set(run_ids)
        if not runs:
            return

        def of_runs(ix: ThreadIndex, key: CheckpointKey) -> bool:
            return ix.checkpoints[key].metadata(self._metadata).get("run_id") in runs

        async for lg_thread, idx in self._threads(None):
            if any(of_runs(idx, key) for key in idx.checkpoints):
                await self._rewrite(lg_thread, of_runs, orphans=False)

    async def adelete_run(self, thread_id: str, run_id: str) -> None:
        """Remove the checkpoints of thread ``thread_id`` whose metadata names ``run_id``
        (and their writes): the thread returns to where it was before that run (a
        rolled-back run, ``wakeful.langgraph.targets``). One thread, fenced like any write."""

        def of_run(ix: ThreadIndex, key: CheckpointKey) -> bool:
            return ix.checkpoints[key].metadata(self._metadata).get("run_id") == run_id

        await self._rewrite(thread_id, of_run, orphans=False)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of the source to the target in one commit."""
        source = await self._complete(self._bind(store_thread_id(source_thread_id)))
        items = [] if source.foreign else source.items()
        if items:
            await self._write(target_thread_id, lambda idx: (items, []))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: keep each namespace's newest checkpoint and its writes (one
        commit per thread, which frees the storage of the rest); ``delete``: delete the
        threads."""
        if strategy not in ("keep_latest", "delete"):
            raise InvalidInput("strategy", "must be 'keep_latest' or 'delete'")
        for lg_thread in thread_ids:
            if strategy == "delete":
                await self.adelete_thread(lg_thread)
                continue
            await self._rewrite(
                lg_thread, lambda ix, key: ix.latest.get(key[0]) != key[1], orphans=True
            )

    async def _rewrite(
        self,
        lg_thread: str,
        remove: Callable[[ThreadIndex, CheckpointKey], bool],
        *,
        orphans: bool,
    ) -> None:
        """Remove the checkpoints ``remove`` picks (with their writes; with ``orphans``,
        also writes whose checkpoint was never put): one commit drops every record holding
        any of them and re-adds those records' surviving items."""
        await self._complete(self._bind(store_thread_id(lg_thread)))  # current, not cached
        await self._write(lg_thread, lambda idx: idx.without(remove, orphans=orphans))
