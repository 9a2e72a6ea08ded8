"""What tracing costs: the 3-node graph of ``runtime_graph`` (durability ``sync``, a fresh
thread per run) in runs per second on the memory and SQLite stores, with tracing turned off
(``telemetry.configure(enabled=False)``: the floor of the instrumentation), with the
OpenTelemetry API and no SDK (the default), and with the SDK recording every span into an
in-memory exporter through a ``BatchSpanProcessor`` (as production would export). The
modes take turns run by run on one store; each run's CPU time is measured. Targets: no SDK
>= 0.99x and SDK >= 0.90x of tracing off.

The ratios are paired: the median run of a block of 24 runs of a mode (four turns through
the six orders of the modes) is divided by that of the tracing-off runs interleaved with
it, the median of the blocks is the round's ratio, and the figure is the median of the
rounds'. A ratio of medians across rounds would measure the machine's load between rounds,
which on a shared machine moves by more than the 1 % being judged.

Each run records 11 spans: the run, 3 supersteps, 3 tasks, the claim_and_commit and 3
commits: the fewest the issue's span list allows for this graph.

The bound: the SDK's own CPU per span (``sdk_span_cost``: the same tree of 11 spans with
their attributes, no wakeful code, through the same processor and exporter) times the spans
of a run, against the run's CPU with tracing off, gives the best ratio any instrumentation
with these spans can reach: ``off / (off + spans x span)``. It is reported beside each SDK
figure. It is measured in a tight loop, where the SDK's code and data stay in the CPU's
caches: inside a run the same spans cost more (decision 0018 counts instructions too)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Collector, Result, rounds_argument
from benchmarks.runtime_graph import State
from wakeful import open_store, telemetry
from wakeful.runtime import START, ClaimPolicy, Graph, Runtime

RUNS = 300
SLICE = 24
"""Runs of each mode per block: a paired ratio per block (four turns through ``ORDERS``)."""
MODES = ("off", "no SDK", "SDK")
ORDERS = tuple(itertools.permutations(MODES))
"""Run by run, the modes take turns in each of their orders in turn, so that each mode
follows each other mode as often (a run just after an SDK run finds the caches full of the
SDK's code and data, and its garbage uncollected)."""


def _graph() -> Any:
    async def node(state: dict[str, Any]) -> dict[str, Any]:
        return {"log": ["x"]}

    g = Graph(State)
    for name in ("a", "b", "c"):
        g.node(name, node)
    return g.edge(START, "a").edge("a", "b").edge("b", "c").compile()


def _set_mode(mode: str, provider: Any) -> None:
    if mode == "off":
        telemetry.configure(enabled=False)
    else:
        telemetry.configure(provider if mode == "SDK" else None)


async def one_round(url: str, runs: int) -> tuple[dict[str, list[float]], float]:
    """CPU seconds per run of each mode, one value per block of ``SLICE`` runs (the block's
    median run, plus the SDK's flush spread over its runs: a collection or an interrupt
    lands on one run, and the median leaves it out for every mode alike), and the spans
    the SDK recorded per run.

    The modes take turns run by run (see ``ORDERS``), so a burst of load from the rest
    of the machine falls on all three alike; each run is timed on its own. CPU time, not
    wall time: the machine is shared, and a process waiting for the CPU is not the
    instrumentation's cost. The SDK's batch processor exports from a thread of this
    process: each block ends with ``force_flush`` timed as the SDK's (its queue never
    reaches a batch within a block, so no export runs during another mode's run) and an
    untimed run while that thread winds down; the order that starts a block rotates."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    processor = BatchSpanProcessor(
        exporter, max_queue_size=1 << 16, max_export_batch_size=SLICE * 16
    )
    provider.add_span_processor(processor)
    graph = _graph()
    cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
    block: dict[str, list[float]] = {mode: [] for mode in MODES}
    clock = time.process_time
    traced = spans = 0
    try:
        async with open_store(url) as store:
            runtime = Runtime(store, ClaimPolicy(ttl=30, renew_every=10))
            for i in range(max(runs // SLICE, 1) * SLICE):
                for mode in ORDERS[(i + i // SLICE) % len(ORDERS)]:
                    _set_mode(mode, provider)
                    thread = f"t-{i}-{MODES.index(mode)}"  # names of one length
                    started = clock()
                    await (await runtime.start(thread, graph, {"log": []})).result()
                    block[mode].append(clock() - started)
                if i % SLICE == SLICE - 1:
                    started = clock()
                    provider.force_flush()
                    flushed = clock() - started
                    # the exporting thread winds down during this run, which is not timed
                    _set_mode("off", provider)
                    await (await runtime.start(f"settle-{i}", graph, {"log": []})).result()
                    for mode in MODES:
                        cpu[mode].append(statistics.median(block[mode]))
                    cpu["SDK"][-1] += flushed / SLICE
                    block = {mode: [] for mode in MODES}
                    traced += SLICE
                    spans += len(exporter.get_finished_spans())
                    exporter.clear()
    finally:
        telemetry.configure()
        provider.shutdown()
    return cpu, spans / max(traced, 1)


def sdk_span_cost(runs: int = 2_000) -> float:
    """The SDK's CPU seconds per span, wakeful not involved: the floor under each of a run's
    spans. The spans form a run's tree with its attributes (a run span with the claim's
    write beneath it, then per superstep a span with its task and its commit beneath it: 11
    spans; the run's status and each write's outcome set at their ends), the run's, the
    supersteps' and the tasks' made current, through the same processor and exporter."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter(), max_queue_size=1 << 16))
    bare = provider.get_tracer("bound")
    run: dict[str, str | int | bool] = {
        "wakeful.run.operation": "start",
        "wakeful.thread.id": "t-1",
        "wakeful.graph": "g",
        "wakeful.run.id": "run-1",
    }
    step: dict[str, str | int | bool] = {"wakeful.step": 1, "wakeful.step.tasks": 1}
    task: dict[str, str | int | bool] = {
        "wakeful.task.id": "x",
        "wakeful.node": "a",
        "wakeful.step": 1,
        "wakeful.task.reused": False,
    }
    write: dict[str, str | int | bool] = {
        "db.system": "memory",
        "db.system.name": "memory",
        "db.operation.name": "commit",
        "wakeful.thread.id": "t-1",
    }

    def leaf(name: str) -> None:
        span = bare.start_span(name, attributes=write)
        span.set_attribute("wakeful.outcome", "ok")
        span.end()

    try:
        gc.collect()
        started = time.process_time()
        for _ in range(runs):
            with bare.start_as_current_span("run", attributes=run) as root:
                leaf("claim_and_commit")
                for _ in range(3):
                    with bare.start_as_current_span("superstep", attributes=step):
                        with bare.start_as_current_span("task", attributes=task):
                            pass
                        leaf("commit")
                root.set_attribute("wakeful.run.status", "completed")
        provider.force_flush()
        return (time.process_time() - started) / (runs * 11)
    finally:
        provider.shutdown()


async def probe(url: str, mode: str, runs: int) -> None:
    """``runs`` graph runs in one mode after 20 warm-up runs, nothing measured: for counting
    instructions under ``valgrind --tool=callgrind`` (the count at ``--runs 200`` minus the
    count at ``--runs 0``, divided by 200, is a run's). Instructions do not depend on the
    machine's load, so they settle what CPU time on a shared machine cannot: a 1 % effect."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter(), max_queue_size=1 << 16))
    _set_mode(mode, provider)
    graph = _graph()
    try:
        async with open_store(url) as store:
            runtime = Runtime(store, ClaimPolicy(ttl=30, renew_every=10))
            for n in range(20 + runs):
                await (await runtime.start(f"t-{n}", graph, {"log": []})).result()
    finally:
        telemetry.configure()
        provider.force_flush()
        provider.shutdown()


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.telemetry_cost")
    parser.add_argument("--runs", type=int, default=RUNS, help="graph runs per measurement")
    rounds_argument(parser, default=5)
    parser.add_argument("--probe", choices=MODES, help="only run --runs runs in this mode")
    parser.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    args = parser.parse_args(argv if argv is not None else [])
    if args.probe is not None:
        with tempfile.TemporaryDirectory() as tmp:
            url = "memory://" if args.store == "memory" else f"sqlite:///{Path(tmp) / 'w.db'}"
            asyncio.run(probe(url, args.probe, args.runs))
        return []
    rates: dict[tuple[str, str], list[float]] = {}
    ratios: dict[tuple[str, str], list[float]] = {}
    spans_per_run = 0.0
    span_costs: list[float] = []
    for _ in range(args.rounds):
        span_costs.append(sdk_span_cost())
        with tempfile.TemporaryDirectory() as tmp:
            for store in ("memory", "sqlite"):
                url = "memory://" if store == "memory" else f"sqlite:///{Path(tmp) / 'w.db'}"
                cpu, spans_per_run = asyncio.run(one_round(url, args.runs))
                for mode, seconds in cpu.items():
                    rates.setdefault((store, mode), []).append(1 / statistics.median(seconds))
                    paired = [off / own for off, own in zip(cpu["off"], seconds, strict=True)]
                    ratios.setdefault((store, mode), []).append(statistics.median(paired))
    print(f"3-node graph, {args.runs} runs per mode x {args.rounds} rounds; runs per CPU second")
    span_cost = statistics.median(span_costs)
    print(f"the SDK alone: {span_cost * 1e6:.1f} us of CPU per span")
    out = Collector("telemetry_cost")
    out.add(
        "the SDK alone, CPU per span", [c * 1e6 for c in span_costs], "us", higher_is_better=False
    )
    for store in ("memory", "sqlite"):
        off = rates[(store, "off")]
        line = "  ".join(f"{m}: {statistics.median(rates[(store, m)]):,.0f}" for m in MODES)
        pairs = "  ".join(f"{m}: {statistics.median(ratios[(store, m)]):.3f}x" for m in MODES[1:])
        print(f"{store:<7} {line}  (paired: {pairs})")
        out.add(f"{store}, tracing off", off, "runs/CPU s")
        for mode, target in (("no SDK", 0.99), ("SDK", 0.90)):
            rate = statistics.median(rates[(store, mode)])
            spans = f", {spans_per_run:.0f} spans per run" if mode == "SDK" else ""
            out.add(
                f"{store}, {mode}",
                ratios[(store, mode)],
                "x tracing off",
                anchor="tracing off, interleaved",
                anchor_samples=1.0,
                target=target,
                note=f"{rate:,.0f} runs/CPU s{spans}",
            )
        ceilings = [1 / (1 + spans_per_run * span_cost * rate) for rate in off]
        out.add(
            f"{store}, SDK: the bound (the SDK's span cost alone)",
            ceilings,
            "x tracing off",
            note=f"off / (off + {spans_per_run:.0f} spans x {span_cost * 1e6:.1f} us)",
        )
    return out.results


if __name__ == "__main__":
    main(sys.argv[1:])
