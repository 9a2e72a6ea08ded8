"""The saver's cached thread index: detached from the caller's values, compact for the
garbage collector, and 8 concurrent runs' writes grouped into shared store transactions."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

import pytest

from tests.test_langgraph_appends import _checkpoint, _conf, three_nodes
from wakeful import open_store
from wakeful.langgraph import WakefulSaver
from wakeful.langgraph.index import Entry, ThreadIndex


def tracked_from(root: object) -> int:
    """How many objects the garbage collector tracks among the data reachable from ``root``
    (containers and index objects; classes and modules are shared, not the index's)."""
    data = (dict, list, tuple, set, Entry, ThreadIndex)
    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or not gc.is_tracked(obj) or type(obj) not in data:
            continue
        seen.add(id(obj))
        stack.extend(gc.get_referents(obj))
    return len(seen)


@pytest.mark.asyncio
async def test_values_the_caller_changes_after_a_write_leave_the_saved_thread_as_written() -> None:
    store = await open_store("memory://")
    saver = WakefulSaver(store)
    try:
        checkpoint = _checkpoint("c1")
        checkpoint["channel_values"] = {"log": ["a"]}
        checkpoint["channel_versions"] = {"log": 1}
        metadata: Any = {"step": 0, "tags": ["x"]}
        config = await saver.aput(_conf("t"), checkpoint, metadata, {"log": 1})
        writes = [("log", ["b"])]
        await saver.aput_writes(config, writes, "task-1")
        checkpoint["channel_values"]["log"].append("changed")
        metadata["tags"].append("changed")
        writes[0][1].append("changed")
        got = await saver.aget_tuple(config)
        assert got is not None
        assert got.checkpoint["channel_values"] == {"log": ["a"]}
        assert got.metadata["tags"] == ["x"]  # type: ignore[typeddict-item]
        assert got.pending_writes == [("task-1", "log", ["b"])]
        assert [t.config async for t in saver.alist(None, filter={"tags": ["x"]})] == [config]
        # what a read returns is a copy too
        got.checkpoint["channel_values"]["log"].append("changed")
        got.pending_writes[0][2].append("changed")
        again = await saver.aget_tuple(config)
        assert again is not None and again.checkpoint["channel_values"] == {"log": ["a"]}
        assert again.pending_writes == [("task-1", "log", ["b"])]
    finally:
        await saver.aclose()
        await store.close()


@pytest.mark.asyncio
async def test_a_cached_thread_leaves_few_objects_for_the_garbage_collector() -> None:
    store = await open_store("memory://")
    saver = WakefulSaver(store)
    try:
        graph = three_nodes(saver)
        cfg: Any = {"configurable": {"thread_id": "t"}}
        await graph.ainvoke({"log": []}, cfg, durability="sync")
        idx = saver._cache[next(iter(saver._cache))]
        assert len(idx.checkpoints) == 5
        # 5 checkpoints and their writes: as decoded items they were 80+ dicts and lists the
        # collector traversed for as long as the thread stayed cached; as bytes in entries
        # the collector does not track (nor metadata decoded before a filter asks for it),
        # only the index's own dicts and their key tuples remain (23 today; 40 with tracked
        # entries and their metadata dicts).
        entries = [*idx.checkpoints.values(), *idx.writes[next(iter(idx.writes))].values()]
        assert not any(gc.is_tracked(e) for e in entries)
        assert all(e.decoded_metadata is None for e in idx.checkpoints.values())
        assert tracked_from(idx) < 30
    finally:
        await saver.aclose()
        await store.close()


@pytest.mark.asyncio
async def test_eight_concurrent_runs_share_the_sqlite_stores_write_transactions(
    tmp_path: Path,
) -> None:
    runs, tasks = 4, 8
    async with WakefulSaver.from_url(f"sqlite:///{tmp_path / 'lg.db'}") as saver:
        graph = three_nodes(saver)
        before = saver.store._db.transactions  # type: ignore[attr-defined]

        async def worker(w: int) -> None:
            for i in range(runs):
                cfg: Any = {"configurable": {"thread_id": f"t-{w}-{i}"}}
                result = await graph.ainvoke({"log": []}, cfg, durability="sync")
                assert result == {"log": ["a", "b", "c"]}

        await asyncio.gather(*(worker(w) for w in range(tasks)))
        transactions = saver.store._db.transactions - before  # type: ignore[attr-defined]
    # Sequentially a run is 6 transactions (1 claim + 5 commits). Nothing in the saver may
    # serialise concurrent threads: runs submitted together share the store's transactions.
    assert transactions <= runs * tasks * 6 / 2


@pytest.mark.asyncio
async def test_one_renewer_keeps_every_hold_alive_and_ends_with_the_saver() -> None:
    store = await open_store("memory://")
    saver = WakefulSaver(store, ttl=1.0, renew_every=0.2, idle_release=60)
    renewals: list[str] = []
    renew = store.renew

    async def counted(thread_id: str, token: int, ttl: float) -> Any:
        renewals.append(thread_id)
        return await renew(thread_id, token, ttl)

    store.renew = counted  # type: ignore[method-assign]
    try:
        for thread in ("t1", "t2", "t3"):
            await saver.aput(_conf(thread), _checkpoint("c1"), {"step": 0}, {})
        first = {t: saver._holds.get(t) for t in ("t1", "t2", "t3")}
        assert all(h is not None for h in first.values())
        renewers = [t for t in asyncio.all_tasks() if t.get_name() == "renew langgraph claims"]
        assert len(renewers) == 1
        deadline = asyncio.get_running_loop().time() + 10
        while not all(renewals.count(t) >= 2 for t in first):
            assert asyncio.get_running_loop().time() < deadline, renewals
            await asyncio.sleep(0.05)
        # every claim was renewed at least twice by the one task; none was lost or replaced
        for thread, hold in first.items():
            assert saver._holds.get(thread) is hold and hold is not None and hold.lost is None
            snap = await store.read(thread)
            assert snap is not None and snap.claim is not None
            assert snap.claim.token == hold.token
    finally:
        await saver.aclose()
        await store.close()
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "renew langgraph claims"]
