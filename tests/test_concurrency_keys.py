"""Concurrency rules at submission (issue 39.1): ``submit(..., concurrency=)`` and
``Registry.add(..., concurrency=)`` give each run its key; the store admits at most the
limit (the store side is in ``wakeful.testkit.key_cases``)."""

from __future__ import annotations

from typing import Any, TypedDict

import pytest

from wakeful import open_store
from wakeful.concurrency import Concurrency, KeyUse
from wakeful.errors import InvalidInput
from wakeful.fleet import Registry
from wakeful.fleet.client import submit
from wakeful.runtime import START, Graph
from wakeful.store.contract import ConcurrencyStore


class State(TypedDict, total=False):
    n: int


def _graph() -> Graph:
    def one(state: dict[str, Any]) -> dict[str, Any]:
        return {"n": 1}

    return Graph(State, name="keyed").node("one", one).edge(START, "one")


@pytest.mark.asyncio
async def test_a_tenant_rule_keys_each_tenant_apart() -> None:
    rule = {"key": "tenant", "limit": 1}
    async with open_store("memory://") as store:
        a1 = await submit(store, "a1", "t", tenant="acme", concurrency=rule)
        a2 = await submit(store, "a2", "t", tenant="acme", concurrency=rule)
        b1 = await submit(store, "b1", "t", tenant="beta", concurrency=rule)
        none = await submit(store, "n1", "t", concurrency=rule)
        assert (a1.concurrency_key, a1.concurrency_limit, a1.status) == (
            "tenant:acme",
            1,
            "pending",
        )
        assert (a2.concurrency_key, a2.status) == ("tenant:acme", "waiting_key")
        assert (b1.concurrency_key, b1.status) == ("tenant:beta", "pending")
        assert (none.concurrency_key, none.status) == (None, "pending"), "no tenant, no key"
        assert isinstance(store, ConcurrencyStore)
        assert await store.concurrency_keys() == [
            KeyUse(key="tenant:acme", limit=1, admitted=1, waiting=1),
            KeyUse(key="tenant:beta", limit=1, admitted=1, waiting=0),
        ]


@pytest.mark.asyncio
async def test_an_input_field_rule_and_a_literal_key() -> None:
    async with open_store("memory://") as store:
        by_user = Concurrency("input.user", 2)
        d = await submit(store, "u1", "t", {"user": "ann", "q": 1}, concurrency=by_user)
        n = await submit(store, "u2", "t", {"user": 7}, concurrency=by_user)
        missing = await submit(store, "u3", "t", {"q": 1}, concurrency=by_user)
        assert (d.concurrency_key, n.concurrency_key, missing.concurrency_key) == (
            "user:ann",
            "user:7",
            None,
        )
        model = await submit(store, "m1", "t", concurrency={"key": "model:gpt", "limit": 4})
        assert (model.concurrency_key, model.concurrency_limit) == ("model:gpt", 4)
        explicit = await submit(
            store, "x1", "t", concurrency_key="mine", concurrency_limit=9, concurrency=by_user
        )
        assert (explicit.concurrency_key, explicit.concurrency_limit) == ("mine", 9)


def test_the_registry_keeps_a_targets_rule_and_refuses_bad_ones() -> None:
    registry = Registry().add("g", _graph().compile(), concurrency={"key": "tenant", "limit": 5})
    assert registry.get("g").concurrency == Concurrency("tenant", 5)
    assert Registry().add("g", _graph().compile()).get("g").concurrency is None
    for bad in ({"key": "tenant"}, {"key": "tenant", "limit": 0}, {"key": "", "limit": 1},
                {"key": "input.", "limit": 1}, {"key": "a\nb", "limit": 1}, "tenant"):  # fmt: skip
        with pytest.raises(InvalidInput):
            Registry().add("g", _graph().compile(), concurrency=bad)  # type: ignore[arg-type]
