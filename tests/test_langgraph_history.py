"""A long LangGraph thread costs what a read or write touches, not its history: a cold read
of the latest checkpoint folds only the newest records, the writer's index stays bounded,
and a thread whose records were written before records named their ``head`` (decision
0030) still reads and continues correctly."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import wakeful.langgraph.index as index_module
import wakeful.langgraph.saver as saver_module
from tests.langgraph_support import fan_out
from wakeful import open_store
from wakeful.langgraph import WakefulSaver
from wakeful.langgraph.index import KEEP
from wakeful.store.contract import Store

CONFIG: Any = {"configurable": {"thread_id": "t"}}
RUNS = 40  # 4 checkpoints a run: 160, ten times what an index keeps


def count_records_read(store: Store) -> list[int]:
    """Count the history records ``store.checkpoints`` hands out from now on."""
    read = [0]
    inner: Callable[..., Awaitable[Any]] = store.checkpoints

    async def counting(*args: Any, **kwargs: Any) -> Any:
        page = await inner(*args, **kwargs)
        read[0] += len(page)
        return page

    store.checkpoints = counting  # type: ignore[method-assign]
    return read


async def _write_runs(url: str, tmp_path: Path, runs: int) -> dict[str, Any]:
    async with WakefulSaver.from_url(url) as saver:
        read = count_records_read(saver.store)
        graph = fan_out(tmp_path / "calls").compile(checkpointer=saver)
        for i in range(runs):
            await graph.ainvoke({"log": [f"turn-{i}"]}, CONFIG, durability="sync")
        idx = saver._cache["t"]
        assert len(idx.checkpoints) <= 2 * KEEP, "the writer's index holds the history"
        assert read[0] == 0, f"the writer read {read[0]} records of its own history"
        latest = await saver.aget_tuple(CONFIG)
        assert latest is not None
        return {"id": latest.checkpoint["id"], "values": latest.checkpoint["channel_values"]}


def _old_record_state(
    thread_id: str, items: list[dict[str, Any]], drop: list[str], head: dict[str, str]
) -> dict[str, Any]:
    """A record as the saver wrote it before decision 0030: no ``head``."""
    return {"langgraph": 1, "thread": thread_id, "items": items, "drop": drop}


@pytest.mark.asyncio
async def test_a_cold_read_of_a_long_thread_reads_only_its_newest_records(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    written = await _write_runs(url, tmp_path, RUNS)
    async with open_store(url) as store:
        read = count_records_read(store)
        saver = WakefulSaver(store)
        latest = await saver.aget_tuple(CONFIG)
        assert latest is not None
        assert latest.checkpoint["id"] == written["id"]
        assert latest.checkpoint["channel_values"] == written["values"]
        assert len(latest.checkpoint["channel_values"]["log"]) == 4 * RUNS
        assert read[0] <= 4, f"{read[0]} records read for the latest checkpoint"
        # what needs the whole thread still sees it all
        history = [t async for t in saver.alist(CONFIG)]
        assert len(history) == 4 * RUNS
        first = await saver.aget_tuple(history[-1].config)
        assert first is not None and first.checkpoint["id"] == history[-1].checkpoint["id"]
        await saver.aclose()


@pytest.mark.asyncio
async def test_a_thread_written_before_records_had_a_head_reads_and_continues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with monkeypatch.context() as old_format:
        old_format.setattr(saver_module, "record_state", _old_record_state)
        old_format.setattr(index_module.ThreadIndex, "trim", lambda self, keep=KEEP: None)
        written = await _write_runs(url, tmp_path, 3)
    async with WakefulSaver.from_url(url) as saver:
        latest = await saver.aget_tuple(CONFIG)
        assert latest is not None and latest.checkpoint["id"] == written["id"]
        assert latest.checkpoint["channel_values"] == written["values"]
        graph = fan_out(tmp_path / "calls").compile(checkpointer=saver)
        result = await graph.ainvoke({"log": ["new"]}, CONFIG)
        assert result["log"] == written["values"]["log"] + ["new", "a", "b", "c"]
        assert len([t async for t in saver.alist(CONFIG)]) == 4 * 4
    async with open_store(url) as store:  # the new record's head makes the next read short
        read = count_records_read(store)
        latest = await WakefulSaver(store).aget_tuple(CONFIG)
        assert latest is not None and latest.checkpoint["channel_values"]["log"] == result["log"]
        assert read[0] <= 4
