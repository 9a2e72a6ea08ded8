"""Bearer tokens: loading, missing and unknown tokens (401), the operator role (403 on
operator routes for tenants), public probes, and development mode."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from tests.server_support import ALPHA, OPERATOR, running_api
from wakeful import open_store
from wakeful.errors import InvalidInput
from wakeful.server.auth import Authenticator, Caller, load_tokens
from wakeful.server.runner import run_server
from wakeful.store.memory import MemoryStore


def test_tokens_load_from_a_json_file_or_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"token-aaaa-1": "alpha", "token-root-1": "*"}), encoding="utf-8")
    assert load_tokens(path) == {"token-aaaa-1": "alpha", "token-root-1": "*"}
    env = {"WAKEFUL_TOKENS": " token-aaaa-1=alpha , token-bbbb-1=beta,"}
    assert load_tokens(environ=env) == {"token-aaaa-1": "alpha", "token-bbbb-1": "beta"}
    assert load_tokens(environ={}) == {}, "nothing configured: development mode"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("[]", "JSON object"),
        ("{broken", "cannot read"),
        ('{"short": "alpha"}', "at least 8"),
        ('{"token-aaaa-1": "bad tenant"}', "tenant"),
        ('{"token-aaaa-1": 3}', "strings"),
    ],
)
def test_a_bad_token_file_is_refused_without_echoing_tokens(
    tmp_path: Path, content: str, problem: str
) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InvalidInput, match=problem) as caught:
        load_tokens(path)
    assert "token-aaaa-1" not in str(caught.value)
    with pytest.raises(InvalidInput):
        load_tokens(environ={"WAKEFUL_TOKENS": "no-separator-here"})
    with pytest.raises(InvalidInput):
        load_tokens(tmp_path / "missing.json")


def test_the_authenticator_resolves_roles() -> None:
    auth = Authenticator({"token-aaaa-1": "alpha", "token-root-1": "*"})
    assert auth.resolve("Bearer token-aaaa-1") == Caller("alpha", operator=False)
    assert auth.resolve("bearer token-root-1") == Caller(None, operator=True)
    assert auth.resolve("Bearer nope-nope-nope") == "invalid"
    assert auth.resolve(None) == auth.resolve("Basic abc") == auth.resolve("Bearer ") == "missing"
    dev = Authenticator(None)
    assert dev.development and dev.resolve(None) == Caller(None, operator=True)


@pytest.mark.asyncio
async def test_missing_and_unknown_tokens_are_401_problems() -> None:
    async with running_api(MemoryStore()) as api:
        for client, challenge in (
            (api.client(None), "Bearer"),
            (api.client("unknown-token-1"), 'Bearer error="invalid_token"'),
        ):
            for method, path in (
                ("GET", "/v1/threads"),
                ("GET", "/v1/threads/t1/events"),
                ("POST", "/v1/threads/t1/runs"),
                ("GET", "/v1/quarantine"),
                ("GET", "/v1/not-a-route"),
            ):
                r = await client.request(method, path, content=b"{not even json")
                assert r.status_code == 401, (method, path, r.text)
                assert r.headers["content-type"] == "application/problem+json"
                assert r.headers["www-authenticate"] == challenge
                assert r.json()["type"] == "urn:wakeful:problem:unauthenticated"
        anonymous = api.client(None)
        for probe in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
            assert (await anonymous.get(probe)).status_code == 200, probe
        assert await api.store.list_dispatches() == []


@pytest.mark.asyncio
async def test_operator_routes_are_403_for_tenant_tokens() -> None:
    async with running_api(MemoryStore()) as api:
        alpha = api.client(ALPHA)
        operator = api.client(OPERATOR)
        for method, path, as_operator in (
            ("GET", "/v1/quarantine", 200),
            ("GET", "/v1/quarantine/d1", 404),
            ("POST", "/v1/dispatches/d1/quarantine", 404),
            ("POST", "/v1/quarantine/d1/requeue", 404),
            ("DELETE", "/v1/quarantine/d1", 404),
        ):
            r = await alpha.request(method, path)
            assert r.status_code == 403, (method, path)
            assert r.json()["type"] == "urn:wakeful:problem:forbidden"
            assert (await operator.request(method, path)).status_code == as_operator


@pytest.mark.asyncio
async def test_development_mode_makes_everyone_an_operator_without_a_tenant() -> None:
    async with running_api(MemoryStore(), tokens=None) as api:
        anyone = api.client(None)
        r = await anyone.post("/v1/threads/t1/runs", json={"target": "echo"})
        assert r.status_code == 202
        d = await api.store.get_dispatch(r.json()["dispatch_id"])
        assert d is not None and d.payload["tenant"] is None
        assert (await anyone.get("/v1/quarantine")).status_code == 200
        ignored = api.client("whatever-token-1")
        assert (await ignored.get("/v1/threads/t1")).status_code == 200


@pytest.mark.asyncio
async def test_run_server_opens_the_store_and_reads_tokens_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WAKEFUL_TOKENS", f"{ALPHA}=alpha")
    stop = asyncio.Event()
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    serving = asyncio.create_task(
        run_server(
            f"sqlite:///{tmp_path / 'store.db'}",
            port=0,
            log_level="warning",
            on_ready=lambda host, port: ready.set_result(port),
            stop=stop,
        )
    )
    try:
        port = await asyncio.wait_for(ready, 20)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/v1/threads")).status_code == 401
            auth = {"Authorization": f"Bearer {ALPHA}"}
            r = await client.post("/v1/threads/t1/runs", json={"target": "echo"}, headers=auth)
            assert r.status_code == 202
    finally:
        stop.set()
        await asyncio.wait_for(serving, 20)
    async with open_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        [d] = await store.list_dispatches()
        assert d.payload["tenant"] == "alpha"
