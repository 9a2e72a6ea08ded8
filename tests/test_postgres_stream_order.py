"""PostgreSQL stream checkpoints are written in groups (issue 24, part 2); a discard must
never overtake a put of the same run queued before it, or the put lands after the discard
and leaves a stream checkpoint behind a committed turn."""

from __future__ import annotations

import asyncio

import pytest

from tests.postgres_support import Databases, open_test_store
from wakeful.records import StreamCheckpoint
from wakeful.store.postgres import messaging

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]


async def test_a_discard_waits_for_the_puts_queued_before_it(
    pg_databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(messaging, "MAX_PUTS", 2)  # more queued puts than one statement takes
    store = await open_test_store(await pg_databases.clone(), pool_size=2)
    try:
        claims = {t: await store.claim(t, "w", 30) for t in ("a", "b", "c")}
        checkpoints = store.stream_checkpoints

        def put(thread: str) -> StreamCheckpoint:
            return StreamCheckpoint(
                run_id=f"run-{thread}",
                thread_id=thread,
                model="m",
                partial_text="so far",
                token=claims[thread].token,
                task_id="task-1",
            )

        # Queued in one loop iteration: puts of a, b and c (c's beyond the first statement's
        # two), then the discard of c's turn.
        writes = [asyncio.ensure_future(checkpoints.put(put(t))) for t in ("a", "b", "c")]
        writes.append(
            asyncio.ensure_future(checkpoints.discard("run-c", "task-1", claims["c"].token))
        )
        await asyncio.gather(*writes)
        assert await checkpoints.get("run-c") is None, "the put queued first was written last"
        assert await checkpoints.get("run-a") is not None
    finally:
        await store.close()
