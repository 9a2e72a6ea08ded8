"""Conformance cases: ``ThreadStore.runs`` (a history grouped into run segments)."""

from __future__ import annotations

from datetime import datetime

import msgspec
import pytest

from wakeful.records import Checkpoint, Claim, Commit, RetentionPolicy, RunSegment
from wakeful.testkit.harness import Harness, Kit

case = pytest.mark.asyncio


async def _commit_runs(
    kit: Kit, thread_id: str, runs: list[tuple[str, int]]
) -> tuple[Claim, list[Checkpoint]]:
    """Commit ``count`` checkpoints of each ``(run_id, count)`` in order; the history, oldest
    first. The last checkpoint of a run is ``completed`` and names graph ``g-<run_id>``."""
    claim = await kit.claimed(thread_id)
    chain: list[Checkpoint] = []
    for run_id, count in runs:
        for i in range(count):
            cp = kit.checkpoint(chain[-1].id if chain else None, run_id=run_id)
            if i == count - 1:
                cp = msgspec.structs.replace(
                    cp, status="completed", metadata={"graph": f"g-{run_id}"}
                )
            await kit.store.commit(thread_id, Commit(token=claim.token, checkpoint=cp))
            chain.append(cp)
    return claim, chain


async def _times(kit: Kit, thread_id: str) -> dict[str, datetime]:
    return {cp.id: at for cp, at in await kit.store.checkpoints(thread_id, limit=1000)}


def _segment(
    times: dict[str, datetime], stretch: list[Checkpoint], count: int | None = None
) -> RunSegment:
    """What ``runs`` reports for ``stretch`` (oldest first, one run id)."""
    first, latest = stretch[0], stretch[-1]
    graph = latest.metadata.get("graph")
    return RunSegment(
        run_id=latest.run_id,
        status=latest.status,
        graph=graph if isinstance(graph, str) else None,
        first_id=first.id,
        last_id=latest.id,
        started_at=times[first.id],
        updated_at=times[latest.id],
        checkpoints=len(stretch) if count is None else count,
    )


class RunCases(Harness):
    @case
    async def test_runs_group_consecutive_checkpoints_of_a_run_newest_first(self, kit: Kit) -> None:
        _, c = await _commit_runs(kit, "t1", [("r-a", 3), ("r-b", 2), ("r-a", 2), ("r-c", 1)])
        times = await _times(kit, "t1")
        whole = [
            _segment(times, c[7:8]),
            _segment(times, c[5:7]),
            _segment(times, c[3:5]),
            _segment(times, c[0:3]),
        ]
        assert await kit.store.runs("t1") == whole
        assert whole[0].graph == "g-r-c" and whole[1].status == "completed"
        first_page = await kit.store.runs("t1", limit=2)
        assert first_page == whole[:2]
        assert await kit.store.runs("t1", before=first_page[-1].first_id, limit=2) == whole[2:]
        # a checkpoint inside a segment: its older part only
        assert await kit.store.runs("t1", before=c[6].id, limit=1) == [_segment(times, c[5:6])]
        assert await kit.store.runs("t1", before=c[0].id) == []
        assert await kit.store.runs("t1", before="cp-unknown") == []
        assert await kit.store.runs("t-unknown") == []
        reopened = await kit.reopen()
        assert await reopened.runs("t1") == whole

    @case
    async def test_runs_start_at_what_retention_kept(self, kit: Kit) -> None:
        _, c = await _commit_runs(kit, "t1", [("r-a", 3), ("r-b", 3), ("r-a", 2)])
        times = await _times(kit, "t1")
        await kit.store.prune(RetentionPolicy(keep_checkpoints=4))
        assert await kit.store.runs("t1") == [
            _segment(times, c[6:8]),
            _segment(times, c[4:6]),
        ]

    @case
    async def test_runs_join_stretches_of_a_run_whose_separation_was_dropped(
        self, kit: Kit
    ) -> None:
        claim, c = await _commit_runs(kit, "t1", [("r-a", 2), ("r-b", 2), ("r-a", 1)])
        latest = kit.checkpoint(c[-1].id, run_id="r-a")
        await kit.store.commit(
            "t1",
            Commit(token=claim.token, checkpoint=latest, drop_checkpoints=(c[2].id, c[3].id)),
        )
        times = await _times(kit, "t1")
        assert await kit.store.runs("t1") == [_segment(times, [*c[0:2], c[4], latest])]
        assert await kit.store.runs("t1", limit=1) == [_segment(times, [*c[0:2], c[4], latest])]

    @case
    async def test_runs_end_with_the_thread(self, kit: Kit) -> None:
        await _commit_runs(kit, "t1", [("r-a", 2)])
        await kit.store.delete_thread("t1")
        assert await kit.store.runs("t1") == []
        _, c = await _commit_runs(kit, "t1", [("r-a", 1)])
        times = await _times(kit, "t1")
        assert await kit.store.runs("t1") == [_segment(times, c)]
