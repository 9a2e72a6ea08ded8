"""LangGraph ``CheckpointTuple`` values built from a thread's index."""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple, writes_sort_key

from wakeful.langgraph.codec import ValueCodec
from wakeful.langgraph.index import Entry, ThreadIndex


def checkpoint_tuple(
    codec: ValueCodec, lg_thread: str, idx: ThreadIndex, entry: Entry, metadata: Any
) -> CheckpointTuple:
    """The checkpoint ``entry`` with its values decoded and its pending writes in the order
    live execution applies them (``writes_sort_key``). ``metadata(item)``: the decoded
    metadata of the checkpoint item."""
    item = entry.item  # a fresh copy: its values need no copying again (``fresh``)
    ns, cid = item["ns"], item["id"]
    checkpoint = codec.decode(item["checkpoint"], f"checkpoint {cid!r}", fresh=True)
    checkpoint["channel_values"] = {
        k: codec.decode(v, f"checkpoint {cid!r} channel {k!r}", fresh=True)
        for k, v in item["values"].items()
    }
    ordered = sorted(
        (e.item for e in idx.writes.get((ns, cid), {}).values()),
        key=lambda w: writes_sort_key(w["path"], w["task"], w["idx"]),
    )
    pending = [
        (
            w["task"],
            w["channel"],
            codec.decode(w["value"], f"write of task {w['task']!r}", fresh=True),
        )
        for w in ordered
    ]

    def config(checkpoint_id: str) -> RunnableConfig:
        return {
            "configurable": {
                "thread_id": lg_thread,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint_id,
            }
        }

    return CheckpointTuple(
        config=config(cid),
        checkpoint=checkpoint,
        metadata=metadata(item),
        parent_config=config(item["parent"]) if item["parent"] else None,
        pending_writes=pending,
    )
