"""The garbage collector's settings for a worker process (``wakeful worker --gc``).

A worker holding hundreds of runs keeps many container objects alive for as long as the
runs stream (their coroutines, tasks, futures). With Python's default thresholds
(700, 10, 10) the collector runs a young collection every 700 net allocations and scans
those live objects again and again while collecting almost nothing: at 1,000 concurrent
streaming runs it took 0.7-2.6 s of a worker's 6 s of CPU, and its full collections were
the event loop's longest pauses (issue 24, decision 0024). A higher first threshold makes
young collections rarer; freezing what start-up allocated (modules, classes, the store)
keeps full collections from scanning it.

These are process-wide settings, so the library never makes them: the ``wakeful worker``
command does (by default, see docs/operations.md), and a program that runs its own worker
may call ``tune`` itself.
"""

from __future__ import annotations

import gc

WORKER_THRESHOLD = (10_000, 10, 10)
"""``gc.set_threshold`` of a ``wakeful worker`` process unless ``--gc python``."""


def parse(text: str) -> tuple[int, int, int] | None:
    """``"python"``: None (leave the collector alone); ``"worker"``: ``WORKER_THRESHOLD``;
    else three comma-separated thresholds (``"10000,10,10"``)."""
    if text == "python":
        return None
    if text == "worker":
        return WORKER_THRESHOLD
    parts = text.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"expected python, worker or three thresholds like 10000,10,10: {text!r}")
    first, second, third = (int(p) for p in parts)
    return first, second, third


def tune(threshold: tuple[int, int, int] | None = WORKER_THRESHOLD) -> None:
    """Set the collector's thresholds and freeze every object allocated so far (call it once
    start-up is done: imports, the registry, the store). ``None`` changes nothing."""
    if threshold is None:
        return
    gc.collect()
    gc.set_threshold(*threshold)
    gc.freeze()


__all__ = ["WORKER_THRESHOLD", "parse", "tune"]
