"""Shared test configuration."""

from __future__ import annotations

import pytest

# The tests that use the machine's shared PostgreSQL server (marked ``postgres``, and the
# chaos cells on it) run on one pytest-xdist worker, one at a time, when the suite runs in
# parallel (``make test``: ``-n 2 --dist loadgroup``): two connection-hungry fleet tests at
# once would pass the server's ``max_connections``. The other worker takes everything else.
SHARED_SERVER_GROUP = "postgres"


def uses_the_shared_server(item: pytest.Item) -> bool:
    path, _, params = item.nodeid.partition("[")
    return (
        item.get_closest_marker("postgres") is not None
        or "postgres" in params
        or "postgres" in path.partition("::")[0]
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if uses_the_shared_server(item):
            item.add_marker(pytest.mark.xdist_group(SHARED_SERVER_GROUP))
