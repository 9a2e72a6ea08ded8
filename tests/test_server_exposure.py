"""What a web page can make the API do (decision 0034): a development-mode server answers
loopback Host names only (DNS rebinding), and no state-changing route is reachable by a
cross-origin request, in any mode. Against a real server on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI

from tests.server_support import OPERATOR, TOKENS, Api, exhausted_dispatch, running_api, seed_thread
from wakeful.records import Dispatch
from wakeful.store.contract import Store
from wakeful.store.memory import MemoryStore

EVIL = "http://evil.example"
STATE_CHANGING = {"POST", "PUT", "PATCH", "DELETE"}


def _routes(routes: list[Any]) -> Iterator[tuple[str, str]]:
    for route in routes:
        inner = getattr(route, "original_router", None)  # an included router (FastAPI 0.165)
        if inner is not None:
            yield from _routes(inner.routes)
        for method in getattr(route, "methods", None) or ():
            yield method, route.path


def state_changing_routes(app: FastAPI) -> list[tuple[str, str]]:
    """Every POST/PUT/PATCH/DELETE route of the app, from its routers and its OpenAPI."""
    found = {(m, p) for m, p in _routes(app.router.routes) if m in STATE_CHANGING}
    for path, item in app.openapi()["paths"].items():
        found |= {(m.upper(), path) for m in item if m.upper() in STATE_CHANGING}
    return sorted(found)


async def _world(store: Store) -> None:
    """A suspended thread with an open ticket, a pending and a quarantined dispatch."""
    await exhausted_dispatch(store, "d-q", "t-2")
    await store.quarantine("d-q")
    await seed_thread(store, "t-1", status="suspended", tickets=("k-1",))
    await store.enqueue(
        Dispatch(dispatch_id="d-p", thread_id="t-1", kind="start", payload={"target": "echo"})
    )


async def _observed(store: Store) -> Any:
    snap = await store.read("t-1")
    dispatches = await store.list_dispatches(limit=100)
    return (
        snap.version if snap else None,
        sorted((d.dispatch_id, d.status, d.attempts) for d in dispatches),
        await store.inbox("t-1"),
    )


def _fill(path: str) -> str:
    dispatch = "d-q" if path.startswith("/v1/quarantine") else "d-p"
    filled = path.replace("{thread_id}", "t-1").replace("{dispatch_id}", dispatch)
    return filled.replace("{message_id}", "m-1")


@pytest.mark.asyncio
@pytest.mark.parametrize("tokens", [None, TOKENS], ids=["development", "tokens"])
async def test_no_state_changing_route_takes_a_cross_origin_request(
    tokens: dict[str, str] | None,
) -> None:
    store = MemoryStore()
    await _world(store)
    async with running_api(store, tokens=tokens) as api:
        routes = state_changing_routes(api.app)
        assert len(routes) >= 8  # runs, resume, cancel, messages, stream, quarantine x3
        travel = {
            ("POST", "/v1/threads/{thread_id}/state"),
            ("POST", "/v1/threads/{thread_id}/fork"),
            ("POST", "/v1/threads/{thread_id}/regenerate"),
            ("POST", "/v1/threads/{thread_id}/messages/{message_id}/edit"),
        }
        assert travel <= set(routes)  # time travel's writes are refused like the others
        before = await _observed(store)
        client = api.client(OPERATOR if tokens else None)
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        attempts: list[tuple[dict[str, str], bytes | None]] = [
            ({"Origin": EVIL}, None),  # fetch(url, {method, mode: "no-cors"})
            ({"Origin": EVIL, **form}, b"reason=x"),  # an auto-submitted <form method=POST>
            ({"Origin": "null"}, None),  # the same from a sandboxed frame
        ]
        for method, path in routes:
            for headers, body in attempts:
                r = await client.request(method, _fill(path), content=body, headers=headers)
                assert r.status_code == 403, (method, path, r.status_code, r.text)
                assert r.json()["type"] == "urn:wakeful:problem:foreign-origin"
        assert await _observed(store) == before


@pytest.mark.asyncio
async def test_the_servers_own_origin_and_clients_without_one_still_work() -> None:
    store = MemoryStore()
    await _world(store)
    async with running_api(store, tokens=None) as api:
        client = api.client(None)
        own = api.url  # what the console's fetch sends
        r = await client.post(
            "/v1/threads/t-1/cancel", json={"reason": "r"}, headers={"Origin": own}
        )
        assert r.status_code == 202, r.text
        r = await client.post("/v1/quarantine/d-q/requeue")  # the Python client: no Origin
        assert r.status_code == 200, r.text
        assert (await store.get_dispatch("d-q")).status == "pending"  # type: ignore[union-attr]
        port = api.url.rsplit(":", 1)[1]
        r = await client.delete(
            "/v1/quarantine/d-q", headers={"Origin": f"http://localhost:{port}"}
        )
        assert r.status_code == 403  # localhost is another origin than 127.0.0.1


async def _host(api: Api, host: str, token: str | None = None) -> int:
    return (await api.client(token).get("/v1/threads", headers={"Host": host})).status_code


@pytest.mark.asyncio
async def test_development_mode_answers_loopback_and_configured_host_names_only() -> None:
    store = MemoryStore()
    await _world(store)
    async with running_api(store, tokens=None, allowed_hosts=["api.internal"]) as api:
        port = api.url.rsplit(":", 1)[1]
        for good in (
            f"127.0.0.1:{port}",
            f"localhost:{port}",
            "[::1]:80",
            "127.0.0.5",
            "api.internal",
        ):
            assert await _host(api, good) == 200, good
        for bad in (f"evil.example:{port}", "127.0.0.1.evil.example", "api.internal.evil"):
            assert await _host(api, bad) == 421, bad
        before = await _observed(store)
        r = await api.client(None).post(
            "/v1/threads/t-1/cancel", json={}, headers={"Host": f"evil.example:{port}"}
        )
        assert r.status_code == 421
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["type"] == "urn:wakeful:problem:host-not-allowed"
        assert await _observed(store) == before
        assert (await api.client(None).get("/healthz", headers={"Host": "10.0.0.7"})).is_success
        # A rebinding page has the same origin as its Host: the Host rule is what stops it.
        r = await api.client(None).get(
            "/console/", headers={"Host": "evil.example", "Origin": "http://evil.example"}
        )
        assert r.status_code == 421


@pytest.mark.asyncio
async def test_with_tokens_the_host_is_not_checked_unless_names_are_configured() -> None:
    store = MemoryStore()
    async with running_api(store) as api:
        assert await _host(api, "api.example.com", OPERATOR) == 200
    async with running_api(store, allowed_hosts=["api.example.com"]) as api:
        assert await _host(api, "api.example.com", OPERATOR) == 200
        assert await _host(api, "evil.example", OPERATOR) == 421


def test_allowed_hosts_are_names() -> None:
    from wakeful.server.app import create_app

    for bad in ("http://api.example.com", "api.example.com:8000", "a b", ""):
        with pytest.raises(ValueError, match="is not a host name"):
            create_app(MemoryStore(), tokens=TOKENS, allowed_hosts=[bad])


@pytest.mark.parametrize(
    ("host", "origin", "own"),
    [
        ("example.com", "https://example.com", True),  # the scheme's default port
        ("example.com:8443", "https://example.com:8443", True),
        ("Example.COM", "https://example.com", True),
        ("[::1]:8000", "http://[::1]:8000", True),
        ("example.com", "http://example.com:443", False),
        ("example.com:8000", "http://example.com:8001", False),
        ("example.com", "http://example.com.evil.example", False),
        ("example.com", "null", False),
        ("example.com", "file://", False),
        ("example.com", "http://exa mple.com", False),
    ],
)
def test_the_servers_own_origin(host: str, origin: str, own: bool) -> None:
    from wakeful.fleet.exposure import Exposure

    headers = [(b"host", host.encode()), (b"origin", origin.encode())]
    refused = Exposure(development=False).refusal("DELETE", headers)
    assert (refused is None) == own
    assert Exposure(development=False).refusal("GET", headers) is None  # reads: CORS's job
