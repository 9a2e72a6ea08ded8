"""Who can make the remote hand run a tool (decision 0034): with tokens, nobody without one
(and nobody reads its calls); without, no page on another site and no other Host name; in
every mode only an ``application/json`` body is a call. Over real HTTP on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.hand_support import Effects, running_hand
from wakeful.fleet.hand import HandRejected, RemoteHand
from wakeful.fleet.tokens import load_tokens

TOKEN = "hand-token-0001"
CALL = b'{"operation_id": "op-1", "tool": "count", "arguments": {"tag": "charge"}}'
JSON = {"Content-Type": "application/json"}


@pytest.mark.asyncio
async def test_with_tokens_a_call_and_a_lookup_need_one(tmp_path: Path) -> None:
    effects = Effects(tmp_path)
    async with (
        running_hand(tmp_path / "ledger.db", effects, tokens={TOKEN: "workers"}) as (url, _),
        httpx.AsyncClient(base_url=url) as anonymous,
        RemoteHand(url, token=TOKEN) as hand,
        RemoteHand(url) as tokenless,
        RemoteHand(url, token="not-the-token") as wrong,
    ):
        for client in (tokenless, wrong):
            with pytest.raises(HandRejected) as refused:
                await client.call("count", {"tag": "charge"}, operation_id="op-1")
            assert refused.value.status == 401
        assert effects.lines() == []
        answer = await hand.call("count", {"tag": "charge"}, operation_id="op-1")
        assert answer["executions"] == 1 and effects.lines() == ["charge"]
        lookup = await anonymous.get("/v1/calls/op-1")
        assert lookup.status_code == 401 and "charge" not in lookup.text
        assert lookup.headers["www-authenticate"] == "Bearer"
        assert (await anonymous.post("/v1/calls", content=CALL, headers=JSON)).status_code == 401
        assert (await anonymous.get("/healthz")).status_code == 200
        assert await hand.lookup("op-1") is not None
    assert effects.lines() == ["charge"]


@pytest.mark.asyncio
async def test_only_a_json_body_is_a_call(tmp_path: Path) -> None:
    effects = Effects(tmp_path)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        running_hand(tmp_path / "ledger.db", effects, tokens={TOKEN: "workers"}) as (url, _),
        httpx.AsyncClient(base_url=url, headers=auth) as client,
    ):
        for media in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
            r = await client.post("/v1/calls", content=CALL, headers={"Content-Type": media})
            assert r.status_code == 415, (media, r.text)
            assert r.headers["content-type"] == "application/problem+json"
        assert (await client.post("/v1/calls", content=CALL)).status_code == 415
        assert effects.lines() == []
        r = await client.post("/v1/calls", content=CALL, headers=JSON)
        assert r.status_code == 200 and effects.lines() == ["charge"]


@pytest.mark.asyncio
async def test_without_tokens_no_web_page_reaches_it(tmp_path: Path) -> None:
    effects = Effects(tmp_path)
    async with (
        running_hand(tmp_path / "ledger.db", effects) as (url, _),
        httpx.AsyncClient(base_url=url) as client,
    ):
        # A page on another site posting text/plain (a "simple" request: no preflight).
        r = await client.post(
            "/v1/calls",
            content=CALL,
            headers={"Content-Type": "text/plain", "Origin": "http://evil.example"},
        )
        assert r.status_code == 403
        r = await client.post("/v1/calls", content=CALL, headers={"Content-Type": "text/plain"})
        assert r.status_code == 415
        # DNS rebinding: the page's own name, resolved to 127.0.0.1.
        rebound = {"Host": "evil.example", "Origin": "http://evil.example", **JSON}
        assert (await client.post("/v1/calls", content=CALL, headers=rebound)).status_code == 421
        assert (await client.get("/v1/calls/op-1", headers=rebound)).status_code == 421
        assert effects.lines() == []
        assert (await client.post("/v1/calls", content=CALL, headers=JSON)).status_code == 200
        assert effects.lines() == ["charge"]


def test_hand_tokens_come_from_their_own_variable() -> None:
    environ = {"WAKEFUL_TOKENS": "api-token-001=alpha", "WAKEFUL_HAND_TOKENS": f"{TOKEN}=w"}
    assert load_tokens(environ=environ, variable="WAKEFUL_HAND_TOKENS") == {TOKEN: "w"}
