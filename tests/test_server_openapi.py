"""The OpenAPI document describes every route, model and error, and schemathesis, with every
check, finds nothing wrong with generated requests (valid and invalid) against the live
server."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from tests.server_support import OPERATOR, running_api, seed_thread
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
    ("get", "/v1/threads/{thread_id}/checkpoints"),
    ("get", "/v1/threads/{thread_id}/children"),
    ("get", "/v1/threads/{thread_id}/history"),
    ("get", "/v1/threads/{thread_id}/checkpoints/{checkpoint_id}"),
    ("post", "/v1/threads/{thread_id}/state"),
    ("post", "/v1/threads/{thread_id}/fork"),
    ("post", "/v1/threads/{thread_id}/regenerate"),
    ("post", "/v1/threads/{thread_id}/messages/{message_id}/edit"),
    ("get", "/v1/whoami"),
    ("get", "/v1/targets"),
    ("post", "/v1/threads/{thread_id}/runs"),
    ("post", "/v1/threads/{thread_id}/resume"),
    ("post", "/v1/threads/{thread_id}/cancel"),
    ("post", "/v1/threads/{thread_id}/messages"),
    ("get", "/v1/workers"),
    ("get", "/v1/versions"),
    ("post", "/v1/versions/migrate"),
    ("get", "/v1/webhooks"),
    ("get", "/v1/limits"),
    ("get", "/v1/dispatches"),
    ("get", "/v1/dispatches/{dispatch_id}"),
    ("post", "/v1/dispatches/{dispatch_id}/quarantine"),
    ("get", "/v1/quarantine"),
    ("get", "/v1/quarantine/{dispatch_id}"),
    ("post", "/v1/quarantine/{dispatch_id}/requeue"),
    ("delete", "/v1/quarantine/{dispatch_id}"),
    ("get", "/v1/schedules"),
    ("put", "/v1/schedules/{name}"),
    ("get", "/v1/schedules/{name}"),
    ("delete", "/v1/schedules/{name}"),
    ("post", "/v1/schedules/{name}/pause"),
    ("post", "/v1/schedules/{name}/resume"),
    ("post", "/v1/schedules/{name}/trigger"),
}


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
    for model in ("HistoryPage", "CheckpointDetail", "UpdateState", "ForkThread", "EditMessage"):
        assert model in components
    assert "from_checkpoint" in components["SubmitRun"]["properties"]
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


SCHEMATHESIS_CONFIG = """
# PUT /v1/schedules/{name}: a cron expression, a time zone and a thread template are checked
# by their meaning (cronsim, zoneinfo: a reversed range such as 5-2 is no cron), which a JSON
# Schema cannot say; 422 answers such a body, though it matches the schema.
[[operations]]
include-method = "PUT"
include-path = "/v1/schedules/{name}"
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "422"]
"""
SCHEMATHESIS_EXAMPLES = 10
SCHEMATHESIS_SEED = 20260116


async def _schemathesis(base_url: str, token: str, workdir: Path) -> tuple[int, str]:
    """The schemathesis command line with every check and every phase against the live
    server (bounded: a fixed seed, few examples per operation); its exit status and output."""
    (workdir / "schemathesis.toml").write_text(SCHEMATHESIS_CONFIG)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        f"{base_url}/openapi.json",
        "--checks=all",
        f"--header=Authorization: Bearer {token}",
        f"--max-examples={SCHEMATHESIS_EXAMPLES}",
        f"--seed={SCHEMATHESIS_SEED}",
        "--generation-deterministic",
        "--request-timeout=10",
        "--suppress-health-check=all",
        "--workers=1",
        "--no-color",
        cwd=workdir,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=110)
    assert process.returncode is not None
    return process.returncode, output.decode("utf-8", "replace")


@pytest.mark.slow
@pytest.mark.asyncio
async def test_schemathesis_finds_nothing_with_every_check(tmp_path: Path) -> None:
    """Every status a route answers is documented, responses match their schemas, valid
    requests are accepted and invalid ones refused, ``Allow`` lists what the path serves."""
    store = MemoryStore()
    await seed_thread(store, "t1", events=3, messages=2, status="suspended", tickets=("q",))
    async with running_api(store, stream_max_seconds=1.0) as api:
        status, output = await _schemathesis(api.url, OPERATOR, tmp_path)
    assert status == 0, output[-6000:]
