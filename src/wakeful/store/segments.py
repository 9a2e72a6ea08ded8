"""Run segments (``ThreadStore.runs``): a thread's checkpoint history grouped into stretches
of consecutive checkpoints of one run id, newest first.

The SQL stores find each stretch with a few index probes (every checkpoint row records the
position where its stretch began when it was committed) and hand the stretches here to be
joined where retention or ``Commit.drop_checkpoints`` removed what separated two stretches of
the same run. The memory and file stores group their in-memory history here directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from wakeful.records import Checkpoint, RunSegment


def graph_of(checkpoint: Checkpoint) -> str | None:
    """The graph a checkpoint names in ``metadata["graph"]``, when that is a string."""
    graph = checkpoint.metadata.get("graph")
    return graph if isinstance(graph, str) else None


def run_segments(history: Sequence[tuple[Checkpoint, datetime]], limit: int) -> list[RunSegment]:
    """The newest ``limit`` segments of ``history`` (oldest first, as a projection keeps it),
    walking back only as far as they reach."""
    found: list[RunSegment] = []
    i = len(history) - 1
    while i >= 0 and len(found) < limit:
        latest, updated_at = history[i]
        j = i
        while j > 0 and history[j - 1][0].run_id == latest.run_id:
            j -= 1
        first, started_at = history[j]
        found.append(
            RunSegment(
                run_id=latest.run_id,
                status=latest.status,
                graph=graph_of(latest),
                first_id=first.id,
                last_id=latest.id,
                started_at=started_at,
                updated_at=updated_at,
                checkpoints=i - j + 1,
            )
        )
        i = j - 1
    return found


def join_adjacent(stretches: Iterable[RunSegment]) -> list[RunSegment]:
    """Stretches newest first, those of one run id next to each other joined into one."""
    joined: list[RunSegment] = []
    for s in stretches:
        if joined and joined[-1].run_id == s.run_id:
            newer = joined[-1]
            joined[-1] = RunSegment(
                run_id=newer.run_id,
                status=newer.status,
                graph=newer.graph,
                first_id=s.first_id,
                last_id=newer.last_id,
                started_at=s.started_at,
                updated_at=newer.updated_at,
                checkpoints=newer.checkpoints + s.checkpoints,
            )
        else:
            joined.append(s)
    return joined
