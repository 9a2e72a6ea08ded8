"""The HTTP API's edges (issue 16): values are refused, never changed (NaN, infinities, a
nesting limit), a body that does not arrive is answered 408, credentials never reach a log
line or an error text."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator
from urllib.parse import urlencode

import pytest
import pytest_asyncio
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.provider_server import ProviderServer, Reply, openai_error
from tests.server_support import ALPHA, DEADLINE, Api, registry, running_api
from tests.telemetry_support import attr, one, spans
from wakeful import telemetry
from wakeful.providers.base import ModelRequest, ProviderError
from wakeful.providers.openai import OpenAIChat
from wakeful.records import Message
from wakeful.store.memory import MemoryStore
from wakeful.store.validate import MAX_JSON_DEPTH
from wakeful.testkit.value_cases import nested

__all__ = ["spans"]
JSON = {"Content-Type": "application/json"}


@pytest_asyncio.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api(MemoryStore()) as running:
        yield running


async def _nothing_queued(api: Api) -> None:
    assert await api.store.list_dispatches() == []


@pytest.mark.asyncio
async def test_nan_and_infinity_in_a_body_are_422_and_nothing_is_queued(api: Api) -> None:
    alpha = api.client(ALPHA)
    bodies = [
        ("runs", '{"target": "echo", "input": {"x": NaN}}'),
        ("runs", '{"target": "echo", "input": [Infinity]}'),
        ("runs", '{"target": "echo", "input": -Infinity}'),
        ("runs", '{"target": "echo", "input": 1e400}'),  # Python reads it as inf
        ("messages", '{"payload": {"price": NaN}}'),
        ("resume", '{"answers": {"q": NaN}}'),
    ]
    for route, body in bodies:
        r = await alpha.post(f"/v1/threads/t1/{route}", content=body, headers=JSON)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["field"] == "body", r.text
    await _nothing_queued(api)


@pytest.mark.asyncio
async def test_a_body_nested_past_the_limit_is_422_and_the_limit_reads_back(api: Api) -> None:
    alpha = api.client(ALPHA)
    for depth in (MAX_JSON_DEPTH, 300):  # the body object itself is one more level
        body = {"target": "echo", "input": nested(depth)}
        r = await alpha.post("/v1/threads/t1/runs", json=body)
        assert r.status_code == 422, (depth, r.text[:300])
    for depth in (5000, 100_000):  # past Python's recursion limit (no encoder writes it)
        text = '{"target": "echo", "input": ' + "[" * depth + "]" * depth + "}"
        r = await alpha.post("/v1/threads/t1/runs", content=text, headers=JSON)
        assert r.status_code == 422, r.text[:300]
    await _nothing_queued(api)
    deepest = {"target": "echo", "input": nested(MAX_JSON_DEPTH - 1)}
    r = await alpha.post("/v1/threads/t1/runs", json=deepest)
    assert r.status_code == 202, r.text[:300]
    listing = await alpha.get("/v1/dispatches", params={"thread_id": "t1"})
    assert listing.status_code == 200, listing.text[:300]
    [view] = listing.json()["dispatches"]
    assert view["payload"]["input"] == deepest["input"]
    one = await alpha.get(f"/v1/dispatches/{view['dispatch_id']}")
    assert one.status_code == 200 and one.json()["payload"]["input"] == deepest["input"]


@pytest.mark.asyncio
async def test_a_body_that_is_not_utf8_is_422_not_400(api: Api) -> None:
    r = await api.client(ALPHA).post(
        "/v1/threads/t1/cancel", content=b'{"reason": "\xff\xfe"}', headers=JSON
    )
    assert r.status_code == 422 and r.json()["field"] == "body", r.text


async def _raw_request(url: str, head: bytes, body: bytes) -> bytes:
    """Send ``head`` and ``body`` on a fresh connection, then read until the server closes
    it (the deadline fails the test if it never answers)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head + body)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), DEADLINE)
    finally:
        writer.close()


@pytest.mark.asyncio
async def test_a_body_that_stops_arriving_is_answered_408_and_closed() -> None:
    store = MemoryStore()
    async with running_api(store, body_timeout=0.5) as api:
        head = (
            b"POST /v1/threads/t1/runs HTTP/1.1\r\nHost: test\r\n"
            b"Authorization: Bearer " + ALPHA.encode() + b"\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        )
        answer = await _raw_request(api.url, head, b'{"target": "ec')
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert b"body-timeout" in answer
        # the server stays healthy for everyone else
        ok = await api.client(ALPHA).post("/v1/threads/t2/runs", json={"target": "echo"})
        assert ok.status_code == 202
    assert [d.thread_id for d in await store.list_dispatches()] == ["t2"]


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.mark.asyncio
async def test_the_access_log_never_shows_a_credential() -> None:
    from wakeful.server.runner import run_server

    lines = _Lines()
    access = logging.getLogger("uvicorn.access")
    stop = asyncio.Event()
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    serving = asyncio.create_task(
        run_server(
            "memory://",
            port=0,
            tokens={ALPHA: "alpha"},
            log_level="info",
            on_ready=lambda host, port: ready.set_result(port),
            stop=stop,
        )
    )
    try:
        port = await asyncio.wait_for(ready, DEADLINE)
        access.addHandler(lines)  # after uvicorn configured its logging
        api = Api(f"http://127.0.0.1:{port}", MemoryStore(), None)  # type: ignore[arg-type]
        client = api.client(None)
        secret = "zq-" + ALPHA
        refused = await client.get(f"/v1/threads?{_credential_query(secret)}")
        assert refused.status_code == 401
        await client.aclose()
    finally:
        stop.set()
        await asyncio.wait_for(serving, DEADLINE)
        access.removeHandler(lines)
    [line] = [line for line in lines.lines if "/v1/threads" in line]
    for name in CREDENTIAL_PARAMS:
        assert f"{name}=[redacted]" in line, line
    assert secret not in line and "limit=5" in line and "after=t0" in line


CREDENTIAL_PARAMS = ("access_token", "api_key", "Authorization", "auth", "bearer", "t")


def _credential_query(secret: str) -> str:
    """A query with the secret under every credential-looking name, and two that are not."""
    values = {name: secret for name in CREDENTIAL_PARAMS}
    values["Authorization"] = f"Bearer {secret}"
    return urlencode({**values, "limit": 5, "after": "t0"})


@pytest.mark.asyncio
async def test_a_server_span_records_the_query_without_its_credentials(
    spans: InMemorySpanExporter,
) -> None:
    secret = "zq-" + ALPHA
    async with running_api(MemoryStore()) as api:
        r = await api.client(ALPHA).get(f"/v1/threads?{_credential_query(secret)}")
        assert r.status_code == 200, r.text
        # as an ASGI instrumentation records its server span, beside the gateway's
        tracer = telemetry.tracer()
        assert tracer is not None
        url = f"{api.url}/v1/threads?{_credential_query(secret)}"
        attributes = {"url.query": _credential_query(secret), "url.full": url}
        tracer.start_span("GET /asgi", attributes=attributes).end()
    finished = spans.get_finished_spans()
    gateway, asgi = one(finished, "GET /v1/threads"), one(finished, "GET /asgi")
    for recorded in (attr(gateway, "url.query"), attr(asgi, "url.query"), attr(asgi, "url.full")):
        text = str(recorded)
        for name in CREDENTIAL_PARAMS:
            assert f"{name}=[redacted]" in text, text
        assert secret not in text and "limit=5" in text and "after=t0" in text


@pytest.mark.asyncio
async def test_a_provider_error_never_echoes_the_configured_key() -> None:
    key = "corp-gateway-key-0123456789"  # not shaped like sk-...: only the configured key
    echo = f"Incorrect API key provided: {key}. Also seen: sk-proj-abcdefghijkl"
    with ProviderServer() as server:
        server.push(Reply(status=401, body=openai_error("invalid_request_error", None, echo)))
        async with OpenAIChat("gpt-4o", base_url=f"{server.url}/v1", api_key=key) as provider:
            request = ModelRequest(
                model="", messages=(Message(id="m1", role="user", content="hi"),)
            )
            with pytest.raises(ProviderError) as caught:
                async for _ in provider.stream(request):
                    pass
    text = str(caught.value)
    assert "Incorrect API key provided" in text, text
    assert key not in text and "sk-proj-abcdefghijkl" not in text, text
    assert text.count("[redacted]") == 2, text


@pytest.mark.asyncio
async def test_an_input_the_target_cannot_take_is_422_at_submit_with_a_registry() -> None:
    async with running_api(MemoryStore(), registry=registry()) as api:
        alpha = api.client(ALPHA)
        refused = [
            ("runs", {"target": "echo", "input": "a string"}, "takes a JSON object"),
            ("runs", {"target": "echo", "input": {"log": [], "colour": 1}}, "['colour']"),
            ("messages", {"payload": "a string"}, "takes a JSON object"),  # default: echo
            ("messages", {"payload": {"colour": 1}, "target": "approval"}, "['colour']"),
        ]
        for route, body, reason in refused:
            r = await alpha.post(f"/v1/threads/t1/{route}", json=body)
            assert r.status_code == 422, (body, r.text)
            assert r.json()["field"] == "input" and reason in r.json()["detail"], r.text
        await _nothing_queued(api)
        ok = await alpha.post("/v1/threads/t1/runs", json={"target": "echo", "input": {"log": []}})
        assert ok.status_code == 202, ok.text


@pytest.mark.asyncio
async def test_an_integer_past_the_conversion_limit_is_422_not_500(api: Api) -> None:
    alpha = api.client(ALPHA)
    huge = "1" * (sys.get_int_max_str_digits() + 1)
    bodies = [
        ("runs", '{"target": "echo", "input": {"n": ' + huge + "}}"),
        ("messages", '{"payload": ' + huge + "}"),
        ("resume", '{"answers": {"q": -' + huge + "}}"),
        ("cancel", '{"reason": ' + huge + "}"),
    ]
    for route, body in bodies:
        r = await alpha.post(f"/v1/threads/t1/{route}", content=body, headers=JSON)
        assert r.status_code == 422, (route, r.text[:300])
        problem = r.json()
        assert problem["field"] == "body", problem
        assert f"longer than {sys.get_int_max_str_digits()} digits" in problem["detail"]
    await _nothing_queued(api)


@pytest.mark.asyncio
async def test_every_405_names_the_methods_its_path_serves(api: Api) -> None:
    alpha = api.client(ALPHA)
    cases = [
        ("PUT", "/v1/threads/t1/runs", "GET, POST"),
        ("DELETE", "/v1/threads/t1", "GET"),
        ("GET", "/v1/threads/t1/cancel", "POST"),
        ("PATCH", "/v1/quarantine/d-1", "DELETE, GET"),
        ("POST", "/healthz", "GET"),
    ]
    for method, path, allowed in cases:
        r = await alpha.request(method, path)
        assert r.status_code == 405, (method, path, r.text)
        assert r.headers["Allow"] == allowed, (method, path, r.headers)
        assert r.headers["Content-Type"] == "application/problem+json"


@pytest.mark.asyncio
async def test_a_last_event_id_past_the_largest_seq_is_422_before_a_run_is_submitted(
    api: Api,
) -> None:
    alpha = api.client(ALPHA)
    await alpha.post("/v1/threads/t1/runs", json={"target": "echo"})
    [queued] = await api.store.list_dispatches()
    late = {"Last-Event-ID": "9999999999999999999", "Accept": "text/event-stream"}
    posted = await alpha.post("/v1/threads/t1/runs/stream", json={"target": "echo"}, headers=late)
    read = await alpha.get("/v1/threads/t1/stream", headers=late)
    for r in (posted, read):
        assert r.status_code == 422, r.text
        assert r.json()["field"] == "Last-Event-ID", r.text
    assert await api.store.list_dispatches() == [queued]  # the stream submitted nothing
