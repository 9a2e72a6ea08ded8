"""LangGraph's own conformance suite (langgraph-checkpoint-conformance) against
``WakefulSaver`` on every store: every capability must be detected and pass."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate

from tests.langgraph_support import KINDS, url_for
from tests.postgres_support import Databases
from wakeful.langgraph import WakefulSaver

pytest_plugins = ["tests.postgres_fixtures"]

CAPABILITIES = {
    "put",
    "put_writes",
    "get_tuple",
    "list",
    "delete_thread",
    "delete_for_runs",
    "copy_thread",
    "prune",
}


async def _validate(url: str, fencing: str) -> None:
    @checkpointer_test(name=f"WakefulSaver[{url.split(':')[0]}, {fencing}]")
    async def saver() -> AsyncIterator[WakefulSaver]:
        async with WakefulSaver.from_url(url, fencing=fencing) as opened:
            yield opened

    report = await validate(saver)
    assert set(report.results) == CAPABILITIES
    failures = {
        name: result.failures
        for name, result in report.results.items()
        if not (result.detected and result.passed)
    }
    assert failures == {}, failures
    assert all(r.tests_passed > 0 and r.tests_failed == 0 for r in report.results.values())


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", [k for k in KINDS if k != "postgres"])
async def test_every_capability_passes(kind: str, tmp_path: Path) -> None:
    await _validate(await url_for(kind, tmp_path, None), "auto")


@pytest.mark.asyncio
@pytest.mark.postgres
async def test_every_capability_passes_on_postgres(tmp_path: Path, pg_databases: Databases) -> None:
    await _validate(await url_for("postgres", tmp_path, pg_databases), "auto")


@pytest.mark.asyncio
async def test_every_capability_passes_without_fencing(tmp_path: Path) -> None:
    await _validate(f"sqlite:///{tmp_path / 'store.db'}", "off")
