"""``wakeful submit --if-busy`` (issue 36): a busy thread queues the submission and says
behind what; ``reject`` is one ``error:`` line and exit 4 (busy, the CLI's conflict code),
with nothing stored; ``rollback`` queues and fences the busy run with a rollback intent."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tests.cli_support import cli, error_line
from wakeful import open_store


def test_submit_if_busy(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    first = cli("submit", "t-1", "greeter", "hi", "--dispatch-id", "d-1", store=url)
    assert first.returncode == 0, first.stderr
    assert "queued" not in first.stdout
    queued = cli("submit", "t-1", "greeter", "again", "--dispatch-id", "d-2", store=url)
    assert queued.returncode == 0, queued.stderr
    assert "queued behind d-1 (the thread is busy)" in queued.stdout
    listed = json.loads(
        cli("submit", "t-1", "greeter", "more", "--if-busy", "coalesce", "--json", store=url).stdout
    )
    assert (listed["status"], listed["if_busy"], listed["queued_behind"]) == (
        "queued",
        "coalesce",
        "d-2",
    )
    refused = cli("submit", "t-1", "greeter", "no", "--if-busy", "reject", "--dispatch-id", "d-x",
                  store=url)  # fmt: skip
    assert refused.returncode == 4, refused.stderr
    line = error_line(refused)
    assert "busy with run 'run-d-1' (dispatch 'd-1')" in line and "if_busy='enqueue'" in line
    rollback = cli("submit", "t-1", "greeter", "undo", "--if-busy", "rollback", "--dispatch-id",
                   "d-r", "--json", store=url)  # fmt: skip
    assert rollback.returncode == 0, rollback.stderr
    assert (json.loads(rollback.stdout)["status"], json.loads(rollback.stdout)["if_busy"]) == (
        "queued",
        "rollback",
    )

    async def stored() -> list[tuple[str, str, object]]:
        async with open_store(url) as store:
            return [
                (d.dispatch_id, d.kind, d.payload)
                for d in await store.list_dispatches(thread_id="t-1", limit=100)
            ]

    rows = asyncio.run(stored())
    assert "d-x" not in [dispatch_id for dispatch_id, _, _ in rows]
    [intent] = [payload for _, kind, payload in rows if kind == "cancel"]
    assert intent == {"reason": "rolled back by d-r", "interrupted_by": "d-r", "rollback": True}
