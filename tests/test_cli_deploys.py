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


def test_a_cli_worker_registers_and_records_its_version(tmp_path: Path) -> None:
    from tests.test_cli_worker import done, start_worker, stop, wait_for
    from wakeful.fleet import submit

    url = f"sqlite:///{tmp_path / 'w.db'}"

    async def enqueue() -> None:
        async with open_store(url) as s:
            await submit(s, "t-named", "flaky", {}, dispatch_id="d-named")

    asyncio.run(enqueue())
    named = start_worker(url, "--version", "2026-12-07.1", "--worker-id", "w-named")
    try:
        wait_for(url, done("d-named"), named)
    finally:
        stop(named)
    hashed = start_worker(url, "--worker-id", "w-hashed")

    async def registered(store: Any) -> bool:
        return "w-hashed" in {w.worker_id for w in await store.list_workers()}

    try:
        wait_for(url, registered, hashed)
    finally:
        stop(hashed)

    async def read() -> tuple[dict[str, Any], Any]:
        async with open_store(url) as s:
            snap = await s.read("t-named")
            assert snap is not None and snap.checkpoint is not None
            return {w.worker_id: w.version for w in await s.list_workers()}, snap.checkpoint

    versions, checkpoint = asyncio.run(read())
    assert versions["w-named"] == "2026-12-07.1"
    assert versions["w-hashed"].startswith("code-"), "the default: a hash of the app's code"
    assert checkpoint.metadata["version"] == "2026-12-07.1"
    listed = json.loads(cli("workers", "list", "--all", "--json", store=url).stdout)
    assert {w["worker_id"]: w["version"] for w in listed} == versions
