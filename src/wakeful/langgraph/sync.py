"""The synchronous half of ``BaseCheckpointSaver`` over the async one.

Each method submits its async counterpart to the saver's event loop and waits
(``bridge.call_on``): what LangGraph's ``graph.invoke`` calls, possibly from its worker
threads.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)

from wakeful.langgraph.bridge import call_on
from wakeful.langgraph.runs import RUN_MARKER, pregel_loop


class SyncMethods(BaseCheckpointSaver[str]):
    """Mixed into ``WakefulSaver``: the sync methods, on the loop in ``_loop``, and the
    channel versions."""

    _loop: asyncio.AbstractEventLoop | None

    async def _get_tuple(
        self, config: RunnableConfig, owner: Any, loop: Any
    ) -> CheckpointTuple | None:
        raise NotImplementedError

    async def _put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        caller: Any,
    ) -> RunnableConfig:
        raise NotImplementedError

    async def _put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
        caller: Any,
    ) -> None:
        raise NotImplementedError

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        # the calling thread, not the loop's task for this call, is what runs the graph
        run = RUN_MARKER in config["configurable"]
        owner, loop = threading.current_thread(), run and pregel_loop(1)
        return call_on(self._loop, self._get_tuple(config, owner, loop))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        async def collect() -> list[CheckpointTuple]:
            listed = self.alist(config, filter=filter, before=before, limit=limit)
            return [t async for t in listed]

        return iter(call_on(self._loop, collect()))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        # the calling thread is the writer (for ``Runs.check``), not the loop's task
        caller = threading.current_thread()
        return call_on(self._loop, self._put(config, checkpoint, metadata, caller))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        caller = threading.current_thread()
        call_on(self._loop, self._put_writes(config, writes, task_id, task_path, caller))

    def delete_thread(self, thread_id: str) -> None:
        call_on(self._loop, self.adelete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        call_on(self._loop, self.adelete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        call_on(self._loop, self.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        call_on(self._loop, self.aprune(thread_ids, strategy=strategy))

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Versions as LangGraph's savers make them (a counter, a random tie-break)."""
        number = 0 if current is None else int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"
