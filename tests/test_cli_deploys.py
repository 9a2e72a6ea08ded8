"""``wakeful runs list`` (issue 40): the runs a deploy affects, by the version they started
on and the patches their code declared."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from tests.cli_support import cli
from tests.test_patches import deploy
from wakeful import open_store
from wakeful.runtime import Runtime


def test_runs_list_filters_by_version_and_patch(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"

    async def runs() -> None:
        async with open_store(url) as store:
            runtime = Runtime(store)
            for thread, version, patches in (
                ("t-old", "v1", []),
                ("t-new", "v2", ["refund-v2"]),
                ("t-done", "v1", []),
            ):
                graph = deploy(patches)
                meta = {"version": version}
                await (await runtime.start(thread, graph, {}, metadata=meta)).result()
            snap = await store.read("t-done")
            assert snap is not None and snap.checkpoint is not None
            ticket = snap.checkpoint.metadata["tickets"][0]["id"]
            await (await runtime.resume("t-done", deploy([]), {ticket: 1})).result()

    asyncio.run(runs())

    def listed(*args: str) -> list[Any]:
        done = cli("runs", "list", "--json", *args, store=url)
        assert done.returncode == 0, done.stderr
        return [(r["thread_id"], r["version"], r["patches"]) for r in json.loads(done.stdout)]

    assert listed("--version", "v1") == [("t-old", "v1", [])], "the runs v1 workers still hold"
    assert listed("--patch", "refund-v2") == [("t-new", "v2", ["refund-v2"])]
    assert listed("--version", "v1", "--all") == [("t-done", "v1", []), ("t-old", "v1", [])]
    assert listed("--patch", "no-such") == []
    assert "t-new" in cli("runs", "list", store=url).stdout
