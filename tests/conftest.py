"""Shared test configuration.

When the suite runs in parallel (``make test``: ``pytest -n 2 --dist loadgroup``), the tests
that use the machine's shared PostgreSQL server (marked ``postgres``, or with ``postgres``
in their id: the chaos cells on it, store-parametrised tests) run on one pytest-xdist
worker, one at a time: two connection-hungry fleet tests at once would pass the server's
``max_connections``. Every other test runs with the rest of its file, in file order, as it
does serially (a module-scoped fixture, such as the console's fleet, is built once and its
tests may build on each other's threads). See ``tests/xdist_groups.py`` and decision 0057.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests import xdist_groups


def pytest_configure(config: pytest.Config) -> None:
    xdist_groups.configure(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    xdist_groups.unconfigure(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    xdist_groups.record_shared_server_tests(config, items)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown without pytest-xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    return xdist_groups.make_scheduler(config, log)
