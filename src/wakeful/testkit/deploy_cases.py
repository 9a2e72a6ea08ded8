"""Conformance cases: deploys in the middle of runs (issue 40). A worker registers the code
version it runs."""

from __future__ import annotations

import pytest

from wakeful.errors import InvalidInput
from wakeful.testkit.harness import Harness, Kit

case = pytest.mark.asyncio


class DeployCases(Harness):
    @case
    async def test_the_registry_lists_each_incarnations_version(self, kit: Kit) -> None:
        await kit.store.register_worker("w-1", version="2026-12-07.1")
        await kit.store.register_worker("w-2")
        listed = {w.worker_id: w.version for w in await kit.store.list_workers()}
        assert listed == {"w-1": "2026-12-07.1", "w-2": None}
        redeployed = await kit.store.register_worker("w-1", version="2026-12-07.2")
        await kit.store.heartbeat(redeployed)
        stopped = await kit.store.retire_worker(redeployed)
        assert stopped.version == "2026-12-07.2"
        reopened = {w.worker_id: w.version for w in await (await kit.reopen()).list_workers()}
        assert reopened == {"w-1": "2026-12-07.2", "w-2": None}, "a new registration replaces it"
        with pytest.raises(InvalidInput):
            await kit.store.register_worker("w-3", version="not a version")
