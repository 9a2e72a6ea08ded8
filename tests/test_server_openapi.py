"""The OpenAPI document describes every route, model and error, and schemathesis finds no
5xx with generated requests (valid and invalid) against the live server."""

from __future__ import annotations

import asyncio
from typing import Any

import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis import GenerationMode
from schemathesis.core.result import Ok

from tests.server_support import running_api, seed_thread
from wakeful import ids
from wakeful.server.schemas import ID_PATTERN
from wakeful.store.memory import MemoryStore

ROUTES = {
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("get", "/v1/threads"),
    ("get", "/v1/threads/{thread_id}"),
    ("get", "/v1/threads/{thread_id}/messages"),
    ("get", "/v1/threads/{thread_id}/runs"),
    ("get", "/v1/threads/{thread_id}/events"),
    ("get", "/v1/threads/{thread_id}/stream"),
    ("post", "/v1/threads/{thread_id}/runs/stream"),
    ("post", "/v1/threads/{thread_id}/runs"),
    ("post", "/v1/threads/{thread_id}/resume"),
    ("post", "/v1/threads/{thread_id}/cancel"),
    ("post", "/v1/threads/{thread_id}/messages"),
    ("get", "/v1/workers"),
    ("get", "/v1/dispatches"),
    ("get", "/v1/dispatches/{dispatch_id}"),
    ("post", "/v1/dispatches/{dispatch_id}/quarantine"),
    ("get", "/v1/quarantine"),
    ("get", "/v1/quarantine/{dispatch_id}"),
    ("post", "/v1/quarantine/{dispatch_id}/requeue"),
    ("delete", "/v1/quarantine/{dispatch_id}"),
}

EXAMPLES = 15


def test_the_id_pattern_is_the_stores() -> None:
    assert f"^{ids._ID.pattern}$" == ID_PATTERN


@pytest.mark.asyncio
async def test_openapi_documents_every_route_model_and_problem() -> None:
    async with running_api(MemoryStore()) as api:
        r = await api.client(None).get("/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    found = {(m, p) for p, item in doc["paths"].items() for m in item}
    assert found == ROUTES
    components = doc["components"]["schemas"]
    for model in ("SubmitRun", "ResumeRun", "CancelRun", "SendMessage", "Accepted", "ThreadView"):
        assert model in components
    for model in ("EventPage", "RunPage", "DispatchPage", "Inspection", "WorkerList", "Problem"):
        assert model in components
    assert "HTTPValidationError" not in components
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert components["SubmitRun"]["additionalProperties"] is False
    for path, item in doc["paths"].items():
        for method, op in item.items():
            assert op.get("description"), (method, path)
            for code, response in op["responses"].items():
                if int(code) >= 400:
                    assert list(response["content"]) == ["application/problem+json"], (path, code)
            if path.startswith("/v1/"):
                assert "401" in op["responses"] and op["security"] == [{"HTTPBearer": []}]
    events = doc["paths"]["/v1/threads/{thread_id}/events"]["get"]["responses"]
    assert set(events["200"]["content"]) == {"application/json", "text/event-stream"}
    assert "410" in events


def _fuzz(base_url: str, raw: dict[str, Any]) -> list[str]:
    """Generated requests for every operation; returns the ones answered 5xx."""
    schema = schemathesis.openapi.from_dict(raw)
    failures: list[str] = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result.err()
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @hypothesis.settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                derandomize=True,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
            def check(case: Any) -> None:
                response = case.call(base_url=base_url, timeout=10)
                if response.status_code >= 500:
                    failures.append(f"{case.method} {case.formatted_path}: {response.status_code}")

            try:
                check()
            except hypothesis.errors.Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE, operation.label  # nothing to break
    return failures


@pytest.mark.asyncio
async def test_schemathesis_finds_no_server_error() -> None:
    store = MemoryStore()
    await seed_thread(store, "t1", events=3, messages=2, status="suspended", tickets=("q",))
    async with running_api(store, tokens=None, stream_max_seconds=1.0) as api:
        raw = (await api.client(None).get("/openapi.json")).json()
        failures = await asyncio.to_thread(_fuzz, api.url, raw)
    assert failures == [], "\n".join(failures[:20])
