"""The shared-PostgreSQL tests on one pytest-xdist worker (see ``tests/conftest.py``).

xdist's own ``loadgroup`` reads ``xdist_group`` marks by renaming node ids, which pytest
9.2 no longer lets it do, so the grouping is done here: each worker writes, after its
collection, which of its tests use the shared server (a mark decides, and marks exist only
in the workers) to a directory the controller made; the controller's scheduler, which sees
only node ids, reads that list when it splits the collection into units of work. A unit is
the whole PostgreSQL group, or one file."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

ENV = "WAKEFUL_XDIST_GROUPS"
"""The directory the controller made for the workers' lists (inherited by the workers)."""
SHARED_SERVER_GROUP = "postgres"


def uses_the_shared_server(item: pytest.Item) -> bool:
    path, _, params = item.nodeid.partition("[")
    return (
        item.get_closest_marker("postgres") is not None
        or "postgres" in params
        or "postgres" in path.partition("::")[0]
    )


def _is_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput") and bool(config.getoption("numprocesses", None))


def configure(config: pytest.Config) -> None:
    if _is_controller(config) and config.getoption("dist", None) == "loadgroup":
        os.environ[ENV] = tempfile.mkdtemp(prefix="wakeful-xdist-")


def unconfigure(config: pytest.Config) -> None:
    if _is_controller(config) and ENV in os.environ:
        shutil.rmtree(os.environ.pop(ENV), ignore_errors=True)


def record_shared_server_tests(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a worker: write the ids of this collection's shared-server tests for the
    controller (atomically: a reader never sees half a list)."""
    workerinput = getattr(config, "workerinput", None)
    directory = os.environ.get(ENV)
    if workerinput is None or directory is None:
        return
    ids = [item.nodeid for item in items if uses_the_shared_server(item)]
    final = Path(directory) / f"{workerinput['workerid']}.json"
    partial = final.with_suffix(".part")
    partial.write_text(json.dumps(ids))
    partial.replace(final)


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist", None) != "loadgroup" or ENV not in os.environ:
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    directory = Path(os.environ[ENV])

    class SharedServerScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """Units of work: the shared-server group, else the test's file."""

        shared: set[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.shared is None:
                # every worker collected (and wrote its list) before the controller splits
                self.shared = set()
                for listed in directory.glob("*.json"):
                    self.shared.update(json.loads(listed.read_text()))
            if nodeid in self.shared:
                return SHARED_SERVER_GROUP
            return nodeid.split("::", 1)[0]

    return SharedServerScheduling(config, log)
