"""Spans and metrics of real runs, recorded by the SDK's in-memory exporter and read back
from ``/metrics`` with ``prometheus_client.parser``."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.metrics_support import families, sample
from tests.runtime_support import eventually
from tests.server_support import ALPHA, OPERATOR, exhausted_dispatch, running_api
from tests.telemetry_support import attr, children, named, one, spans
from wakeful import DispatchConflict, ManualClock, telemetry
from wakeful.agent import Agent, StreamPolicy, tool
from wakeful.fleet import LocalWake, Registry, Worker, submit
from wakeful.metrics import Metrics, serve_metrics
from wakeful.providers.scripted import Fail, Scripted, calls, reply
from wakeful.runtime import START, ClaimPolicy, Graph, Runtime, append
from wakeful.store.memory import MemoryStore

__all__ = ["spans"]
ROOT = Path(__file__).resolve().parent.parent


class State(TypedDict):
    log: Annotated[list[str], append]


def fan_out() -> Any:
    """``a`` and ``b`` in one superstep (each result committed as a pending write), then
    ``c`` alone."""

    async def node(state: dict[str, Any]) -> dict[str, Any]:
        return {"log": ["x"]}

    g = Graph(State, name="fan").node("a", node).node("b", node).node("c", node)
    return g.edge(START, "a").edge(START, "b").edge("a", "c").edge("b", "c").compile()


@pytest.mark.asyncio
async def test_a_graph_run_is_one_tree_of_run_supersteps_tasks_and_commits(
    spans: InMemorySpanExporter,
) -> None:
    store = MemoryStore(ManualClock())
    metrics = Metrics()
    runtime = Runtime(store, metrics=metrics)
    handle = await runtime.start("t", fan_out(), {"log": []})
    await handle.result()
    finished = spans.get_finished_spans()
    run = one(finished, "wakeful.run fan")
    assert run.parent is None and run.context is not None
    assert attr(run, "wakeful.run.status") == "completed" and attr(run, "wakeful.run.id")
    assert {s.context.trace_id for s in finished if s.context} == {run.context.trace_id}

    under_run = children(finished, run)
    steps = sorted((s for s in under_run if s.name.startswith("wakeful.superstep")), key=_start)
    assert [s.name for s in steps] == ["wakeful.superstep 0", "wakeful.superstep 1"]
    assert [s.name for s in under_run if s not in steps] == ["claim_and_commit memory"]

    first, second = steps
    tasks = sorted(s.name for s in children(finished, first) if s.name.startswith("wakeful.task"))
    assert tasks == ["wakeful.task a", "wakeful.task b"]
    for task in named(finished, "wakeful.task a") + named(finished, "wakeful.task b"):
        commits = [s for s in children(finished, task) if s.name == "commit memory"]
        assert len(commits) == 1, "a task of a fan-out commits its pending write beneath it"
        assert attr(commits[0], "db.system") == "memory"
        assert attr(commits[0], "wakeful.outcome") == "ok"
    assert [s.name for s in children(finished, first) if s.name == "commit memory"] == [
        "commit memory"
    ], "the barrier's checkpoint"
    assert sorted(s.name for s in children(finished, second)) == [
        "commit memory",
        "wakeful.task c",
    ]
    # 2 pending writes + 2 checkpoints (the admission is the claim_and_commit)
    assert metrics.commit_seconds.count(store="memory", operation="commit") == 4
    assert metrics.commit_seconds.count(store="memory", operation="claim_and_commit") == 1

    snap = await store.read("t")
    assert snap is not None and snap.checkpoint is not None
    stored = snap.checkpoint.metadata["trace"]["traceparent"]
    assert stored.split("-")[1:3] == [f"{run.context.trace_id:032x}", f"{run.context.span_id:016x}"]


def _start(span: Any) -> int:
    return int(span.start_time or 0)


@pytest.mark.asyncio
async def test_without_an_sdk_a_run_records_nothing_and_stores_no_trace() -> None:
    store = MemoryStore(ManualClock())
    await (await Runtime(store).start("t", fan_out(), {"log": []})).result()
    snap = await store.read("t")
    assert snap is not None and snap.checkpoint is not None
    assert "trace" not in snap.checkpoint.metadata


def lookup_tool(counter: dict[str, int]) -> Any:
    @tool(replay="keyed")
    def lookup(city: str) -> dict[str, Any]:
        """Weather for a city."""
        counter[city] = counter.get(city, 0) + 1
        return {"city": city, "sky": "clear"}

    return lookup


async def no_sleep(seconds: float) -> None:
    return None


@pytest.mark.asyncio
async def test_an_agent_turn_shows_the_retried_model_call_and_the_tool_call(
    spans: InMemorySpanExporter,
) -> None:
    provider = Scripted.of(
        [Fail("server", status=503)],
        calls(("c1", "lookup", {"city": "Oslo"})),
        reply("Clear in Oslo."),
    )
    counter: dict[str, int] = {}
    agent = Agent("helper", provider, "Be brief.", [lookup_tool(counter)], sleep=no_sleep)
    agent.stream_policy = StreamPolicy(checkpoints=False)
    agent.metrics = Metrics()
    answer = await agent.run(Runtime(MemoryStore(ManualClock())), "t", "Secret question?")
    assert answer.text == "Clear in Oslo." and counter == {"Oslo": 1}

    finished = spans.get_finished_spans()
    chats = sorted(named(finished, "chat scripted"), key=_start)
    assert len(chats) == 2
    retried, final = chats
    assert attr(retried, "gen_ai.operation.name") == "chat"
    assert attr(retried, "gen_ai.request.model") == "scripted"
    assert attr(retried, "gen_ai.provider.name") == "scripted"
    assert attr(retried, "gen_ai.response.finish_reasons") == ("tool_use",)
    assert attr(retried, "gen_ai.usage.input_tokens") == 10
    assert attr(retried, "gen_ai.usage.output_tokens") == 5
    assert attr(retried, "wakeful.model.attempts") == 2
    events = [(e.name, dict(e.attributes or {})) for e in retried.events]
    assert [name for name, _ in events] == [
        "wakeful.model.retry",
        "wakeful.stream.recovery",
        "gen_ai.first_token",
    ]
    assert events[0][1]["error.type"] == "server"
    assert events[0][1]["http.response.status_code"] == 503
    assert events[1][1]["wakeful.stream.plan"] == "retry"
    assert events[2][1]["wakeful.model.attempt"] == 2
    assert attr(final, "gen_ai.response.finish_reasons") == ("end_turn",)
    for chat in chats:  # no prompt or completion text without the opt-in
        text = str(dict(chat.attributes or {})) + str([e.attributes for e in chat.events])
        assert "Secret" not in text and "Be brief" not in text and "Oslo" not in text

    call = one(finished, "execute_tool lookup")
    assert attr(call, "gen_ai.tool.name") == "lookup" and attr(call, "gen_ai.tool.call.id") == "c1"
    assert attr(call, "wakeful.tool.replay") == "keyed"
    assert attr(call, "wakeful.tool.execution") == "run"
    assert attr(call, "wakeful.tool.outcome") == "ok"
    assert len(str(attr(call, "wakeful.tool.idempotency_key"))) == 32
    task = one(finished, "wakeful.task tool")
    assert call.parent is not None and task.context is not None
    assert call.parent.span_id == task.context.span_id
    model_tasks = named(finished, "wakeful.task model")
    assert {c.parent.span_id for c in chats if c.parent} == {
        t.context.span_id for t in model_tasks if t.context
    }

    metrics = agent.metrics
    assert metrics.first_token.count(model="scripted") == 2, "the failed attempt had no token"
    assert metrics.token_rate.count(model="scripted") == 2
    assert metrics.model_retries.value(model="scripted", kind="server") == 1
    assert metrics.recoveries.value(kind="retry") == 1
    assert metrics.tool_seconds.count(tool="lookup", outcome="ok") == 1


@pytest.mark.asyncio
async def test_prompt_and_completion_text_are_recorded_only_when_opted_in(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    agent = Agent("helper", Scripted.of(reply("Sunny.")), "Be brief.")
    await agent.run(Runtime(MemoryStore(ManualClock())), "t", "Weather?")
    chat = one(spans.get_finished_spans(), "chat scripted")
    assert "Weather?" in str(attr(chat, "gen_ai.input.messages"))
    assert "Sunny." in str(attr(chat, "gen_ai.output.messages"))
    assert attr(chat, "gen_ai.system_instructions") == "Be brief."


GRAPH = Graph({"x": None}, name="g").node("n", lambda s: {"x": 1}).edge(START, "n").compile()


@pytest.mark.asyncio
async def test_a_workers_metrics_count_the_work_it_did() -> None:
    store = MemoryStore(ManualClock())
    wake = LocalWake()
    worker = Worker(store, Registry().add("g", GRAPH), wake=wake, poll_interval=0.05)
    running = asyncio.create_task(worker.run())
    for i in range(3):
        await submit(store, f"t{i}", "g", {}, dispatch_id=f"d{i}", wake=wake)
    await eventually(lambda: worker.metrics.settles.value(outcome="done") == 3)
    server = await serve_metrics(worker.metrics, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
        await writer.drain()
        response = (await reader.read()).decode()
        writer.close()
        await writer.wait_closed()
    finally:
        server.close()
        await server.wait_closed()
        await worker.stop(2)
        await running
    text = response.split("\r\n\r\n", 1)[1]
    done = 'target="g",outcome="done"'
    assert sample(text, f"wakeful_run_duration_seconds_count{{{done}}}") == 3
    assert sample(text, 'wakeful_queue_wait_seconds_count{kind="start"}') == 3
    assert sample(text, 'wakeful_settles_total{outcome="done"}') == 3
    assert sample(text, "wakeful_leases_total") == 3
    writes = 'store="memory",operation="commit"'
    # each run: the admission commit and the ending commit (which settles the dispatch)
    assert sample(text, f"wakeful_store_write_duration_seconds_count{{{writes}}}") == 6
    polls = 'store="memory",operation="claim_next"'
    assert sample(text, f"wakeful_store_write_duration_seconds_count{{{polls}}}") >= 1
    assert sample(text, "wakeful_worker_running_dispatches") == 0
    assert sample(text, "process_cpu_seconds_total") > 0


@pytest.mark.asyncio
async def test_an_http_submit_continues_the_callers_trace_and_metrics_show_the_fleet(
    spans: InMemorySpanExporter,
) -> None:
    store = MemoryStore()
    await store.register_worker("w1")
    await exhausted_dispatch(store, "dq", "tq")
    caller_trace, caller_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    async with running_api(store) as api:
        accepted = await api.client(ALPHA).post(
            "/v1/threads/t1/runs",
            json={"target": "echo"},
            headers={"traceparent": f"00-{caller_trace}-{caller_span}-01"},
        )
        assert accepted.status_code == 202
        await api.client(OPERATOR).post("/v1/dispatches/dq/quarantine")
        scrape = (await api.client(None).get("/metrics")).text
    finished = spans.get_finished_spans()
    request = one(finished, "POST /v1/threads/{thread_id}/runs")
    assert request.context is not None and request.parent is not None
    assert f"{request.context.trace_id:032x}" == caller_trace
    assert f"{request.parent.span_id:016x}" == caller_span
    assert attr(request, "http.response.status_code") == 202
    submitted = one(finished, "wakeful.submit start")
    assert submitted.parent is not None and submitted.parent.span_id == request.context.span_id
    (stored,) = await store.list_dispatches(thread_id="t1")
    assert stored.payload["trace"]["traceparent"].split("-")[1] == caller_trace
    assert sample(scrape, "wakeful_workers_live") == 1
    assert sample(scrape, "wakeful_leases_live") == 0
    assert sample(scrape, "wakeful_quarantines_total") == 1
    assert sample(scrape, 'wakeful_queue_depth{status="pending"}') == 1


@pytest.mark.asyncio
async def test_a_resubmission_from_another_trace_is_the_same_dispatch(
    spans: InMemorySpanExporter,
) -> None:
    store = MemoryStore(ManualClock())
    with telemetry.span("first"):
        first = await submit(store, "t", "g", {"n": 1}, dispatch_id="d1")
    with telemetry.span("retry"):
        again = await submit(store, "t", "g", {"n": 1}, dispatch_id="d1")
    assert again == first
    with pytest.raises(DispatchConflict), telemetry.span("different"):
        await submit(store, "t", "g", {"n": 2}, dispatch_id="d1")


@pytest.mark.asyncio
async def test_the_grafana_dashboard_charts_only_metrics_wakeful_exposes() -> None:
    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text("utf-8"))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    charted = {
        re.sub(r"_(bucket|count|sum|total)$", "", name)
        for expr in exprs
        for name in re.findall(r"\bwakeful_[a-z_]+", expr)
    }
    async with running_api(MemoryStore()) as api:
        scrape = (await api.client(None).get("/metrics")).text
    worker = Worker(MemoryStore(), Registry().add("g", GRAPH), metrics=Metrics())
    # a server and its workers are scraped apart: the dashboard charts what both expose
    exposed = set(families(scrape)) | set(families(worker.metrics.render()))
    assert charted and charted <= exposed, charted - exposed


@pytest.mark.asyncio
async def test_a_tool_call_run_again_after_a_recovery_is_marked_replayed(
    spans: InMemorySpanExporter,
) -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    charged: list[int] = []
    stuck = asyncio.Event()

    @tool(replay="keyed")
    async def charge(amount: int) -> str:
        """Charge a card."""
        charged.append(amount)
        if len(charged) == 1:
            await stuck.wait()  # the first attempt never finishes
        return "charged"

    provider = Scripted.of(calls(("c1", "charge", {"amount": 5})), reply("Done."))
    agent = Agent("payer", provider, tools=[charge], sleep=no_sleep)
    agent.stream_policy = StreamPolicy(checkpoints=False)

    async def never(seconds: float) -> None:
        await asyncio.Event().wait()

    policy = ClaimPolicy(ttl=5, renew_every=1)
    first = await agent.start(Runtime(store, policy, clock, renew_sleep=never), "t", "Pay.")
    await eventually(lambda: charged == [5])
    clock.advance(60)  # the first attempt's claim expired: it counts as crashed
    recovered = await agent.recover(Runtime(store, policy, clock, renew_sleep=never), "t")
    await first.cancel()
    assert recovered.text == "Done." and charged == [5, 5]
    replayed = [
        s
        for s in named(spans.get_finished_spans(), "execute_tool charge")
        if attr(s, "wakeful.tool.outcome") == "ok"
    ]
    assert len(replayed) == 1
    assert attr(replayed[0], "wakeful.tool.execution") == "replayed"
    assert attr(replayed[0], "wakeful.tool.replay") == "keyed"
