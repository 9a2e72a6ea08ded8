"""What the console needs from the server: its assets at ``/console`` (no token, a strict
Content-Security-Policy, revalidated by ETag), ``GET /v1/whoami``, the thread list's
filters (id prefix, status, target) and a thread's checkpoint history."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.server_support import ALPHA, BETA, OPERATOR, Api, running_api, seed_thread
from wakeful.server import console
from wakeful.server.routes import threads
from wakeful.store.memory import MemoryStore


@pytest_asyncio.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api(MemoryStore()) as running:
        yield running


@pytest.mark.asyncio
async def test_the_console_is_served_without_a_token_with_a_strict_policy(api: Api) -> None:
    anonymous = api.client(None)
    r = await anonymous.get("/console")
    assert r.status_code == 308 and r.headers["location"] == "/console/"
    page = await anonymous.get("/console/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "connect-src 'self'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert '<script type="module" src="/console/assets/app.js">' in page.text
    script = await anonymous.get("/console/assets/app.js")
    assert script.status_code == 200
    assert script.headers["content-type"].startswith("text/javascript")
    again = await anonymous.get(
        "/console/assets/app.js", headers={"If-None-Match": script.headers["etag"]}
    )
    assert again.status_code == 304 and again.content == b""
    assert (await anonymous.get("/console/assets/nothing.js")).status_code == 404
    assert (await anonymous.get("/console/assets/..%2F__init__.py")).status_code == 404
    assert "/console/" not in (await anonymous.get("/openapi.json")).json()["paths"]


def test_every_asset_the_page_imports_is_shipped_and_nothing_loads_from_elsewhere() -> None:
    import re

    names = set(console.ASSETS)
    for name, asset in console.ASSETS.items():
        text = asset.body.decode("utf-8")
        for imported in re.findall(r"(?:from |import\()\"\./([\w.-]+)\"", text):
            assert imported in names, f"{name} imports {imported}, which is not shipped"
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", ""), name
        assert "https://" not in text, name
        markup = re.search(r"\.(innerHTML|outerHTML)\s*=|insertAdjacentHTML|document\.write", text)
        assert markup is None, f"{name}: API data must never become markup"
    index = console.ASSETS["index.html"].body.decode()
    for ref in re.findall(r"/console/assets/([\w.-]+)", index):
        assert ref in names


@pytest.mark.asyncio
async def test_whoami_names_the_tenant_and_the_role(api: Api) -> None:
    alpha = (await api.client(ALPHA).get("/v1/whoami")).json()
    assert alpha == {"tenant": "alpha", "operator": False, "development": False}
    operator = (await api.client(OPERATOR).get("/v1/whoami")).json()
    assert operator == {"tenant": None, "operator": True, "development": False}
    assert (await api.client(None).get("/v1/whoami")).status_code == 401
    assert (await api.client("wrong-token-0000").get("/v1/whoami")).status_code == 401


@pytest.mark.asyncio
async def test_whoami_in_development_mode() -> None:
    async with running_api(MemoryStore(), tokens=None) as dev:
        me = (await dev.client(None).get("/v1/whoami")).json()
    assert me == {"tenant": None, "operator": True, "development": True}


async def _ids(api: Api, token: str, **params: str | int) -> tuple[list[str], str | None]:
    r = await api.client(token).get("/v1/threads", params=params)
    assert r.status_code == 200, r.text
    page = r.json()
    return [t["thread_id"] for t in page["threads"]], page["next_after"]


@pytest.mark.asyncio
async def test_thread_prefix_search_reads_the_prefix_range_only(api: Api) -> None:
    for thread in ("order", "order-1", "order-2", "order-3", "orders", "other", "a"):
        await seed_thread(api.store, thread, tenant="alpha")
    await seed_thread(api.store, "order-9", tenant="beta")
    assert await _ids(api, ALPHA, prefix="order-") == (["order-1", "order-2", "order-3"], None)
    assert await _ids(api, ALPHA, prefix="order") == (
        ["order", "order-1", "order-2", "order-3", "orders"],
        None,
    )
    assert await _ids(api, ALPHA, prefix="order", limit=2) == (["order", "order-1"], "order-1")
    assert await _ids(api, ALPHA, prefix="order", after="order-1", limit=2) == (
        ["order-2", "order-3"],
        "order-3",
    )
    assert await _ids(api, BETA, prefix="order") == (["order-9"], None)
    assert await _ids(api, BETA, prefix="order-1") == ([], None)  # another tenant's: unseen
    assert await _ids(api, OPERATOR, prefix="order-") == (
        ["order-1", "order-2", "order-3", "order-9"],
        None,
    )
    assert await _ids(api, ALPHA, prefix="zzz") == ([], None)


@pytest.mark.asyncio
async def test_threads_filter_by_status_and_target(api: Api) -> None:
    await seed_thread(api.store, "t1", tenant="alpha", status="completed", graph="sorter")
    await seed_thread(api.store, "t2", tenant="alpha", status="running", graph="sorter")
    await seed_thread(api.store, "t3", tenant="alpha", status="completed", graph="chat")
    await seed_thread(api.store, "t4", tenant="beta", status="completed", graph="sorter")
    assert await _ids(api, ALPHA, status="completed") == (["t1", "t3"], None)
    assert await _ids(api, ALPHA, target="sorter") == (["t1", "t2"], None)
    assert await _ids(api, ALPHA, status="completed", target="sorter") == (["t1"], None)
    assert await _ids(api, OPERATOR, status="completed", target="sorter") == (["t1", "t4"], None)
    assert await _ids(api, ALPHA, status="completed", limit=1) == (["t1"], "t1")
    assert await _ids(api, ALPHA, status="completed", after="t1", limit=1) == (["t3"], "t3")
    r = await api.client(ALPHA).get("/v1/threads", params={"status": "bogus"})
    assert r.status_code == 422 and r.json()["field"] == "status"


@pytest.mark.asyncio
async def test_a_filtered_scan_is_bounded_and_continues(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(threads, "SCAN_LIMIT", 4)
    monkeypatch.setattr(threads, "SCAN_BATCH", 2)
    for i in range(9):
        status = "failed" if i in (1, 7) else "completed"
        await seed_thread(api.store, f"t{i}", tenant="alpha", status=status)
    # at most 4 threads are looked at per request: a short page and a cursor to go on
    assert await _ids(api, ALPHA, status="failed") == (["t1"], "t3")
    assert await _ids(api, ALPHA, status="failed", after="t3") == (["t7"], "t7")
    assert await _ids(api, ALPHA, status="failed", after="t7") == ([], None)


@pytest.mark.asyncio
async def test_checkpoint_history_newest_first_with_states_and_pages(api: Api) -> None:
    for ordinal in range(1, 5):
        await seed_thread(api.store, "t1", tenant="alpha", state={"n": ordinal})
    alpha = api.client(ALPHA)
    page = (await alpha.get("/v1/threads/t1/checkpoints", params={"limit": 3})).json()
    assert [c["id"] for c in page["checkpoints"]] == ["run-1-c4", "run-1-c3", "run-1-c2"]
    assert [c["state"] for c in page["checkpoints"]] == [{"n": 4}, {"n": 3}, {"n": 2}]
    assert page["checkpoints"][0]["parent"] == "run-1-c3"
    assert page["checkpoints"][0]["metadata"]["graph"] == "g"
    assert page["next_before"] == "run-1-c2"
    rest = (await alpha.get("/v1/threads/t1/checkpoints", params={"before": "run-1-c2"})).json()
    assert [c["id"] for c in rest["checkpoints"]] == ["run-1-c1"]
    assert rest["next_before"] is None
    bare = (await alpha.get("/v1/threads/t1/checkpoints", params={"state": "false"})).json()
    assert all(c["state"] is None for c in bare["checkpoints"])
    assert (await api.client(BETA).get("/v1/threads/t1/checkpoints")).status_code == 404
    assert (await api.client(BETA).get("/v1/threads/nope/checkpoints")).status_code == 404
