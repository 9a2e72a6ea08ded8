"""What tracing costs: the 3-node graph of ``runtime_graph`` (durability ``sync``, a fresh
thread per run) in runs per second on the memory and SQLite stores, with tracing turned off
(``telemetry.configure(enabled=False)``: the floor of the instrumentation), with the
OpenTelemetry API and no SDK (the default), and with the SDK recording every span into an
in-memory exporter through a ``BatchSpanProcessor`` (as production would export). Each round
interleaves the three modes in slices of 25 runs on one store and measures CPU time.
Targets: no SDK >= 0.99x and SDK >= 0.90x of tracing off.

Each run records 11 spans: the run, 3 supersteps, 3 tasks, the claim_and_commit and 3
commits: the fewest the issue's span list allows for this graph.

The bound: the SDK's own CPU per span (``sdk_span_cost``: an empty span with four
attributes, started as current and ended, through the same processor and exporter, no wakeful
code) times the spans of a run, against the run's CPU with tracing off, gives the best ratio
any instrumentation with these spans can reach: ``off / (off + spans x span)``. It is reported
beside each SDK figure."""

from __future__ import annotations

import argparse
import asyncio
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
SLICE = 25
"""Runs per slice: each round interleaves the modes slice by slice on one store."""
MODES = ("off", "no SDK", "SDK")


def _graph() -> Any:
    async def node(state: dict[str, Any]) -> dict[str, Any]:
        return {"log": ["x"]}

    g = Graph(State)
    for name in ("a", "b", "c"):
        g.node(name, node)
    return g.edge(START, "a").edge("a", "b").edge("b", "c").compile()


async def one_round(url: str, runs: int) -> tuple[dict[str, float], float]:
    """Runs per second of CPU time in each mode (median of its slices), and the spans the
    SDK recorded per run. CPU time, not wall time: the machine is shared, and a process
    waiting for the CPU is not the instrumentation's cost."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=1 << 16))
    graph = _graph()
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    traced = 0
    try:
        async with open_store(url) as store:
            runtime = Runtime(store, ClaimPolicy(ttl=30, renew_every=10))
            for i in range(max(runs // SLICE, 1)):
                order = MODES[i % 3 :] + MODES[: i % 3]
                for mode in order:
                    if mode == "off":
                        telemetry.configure(enabled=False)
                    else:
                        telemetry.configure(provider if mode == "SDK" else None)
                    started = time.process_time()
                    for n in range(SLICE):
                        thread = f"t-{i}-{mode}-{n}".replace(" ", "")
                        await (await runtime.start(thread, graph, {"log": []})).result()
                    rates[mode].append(SLICE / max(time.process_time() - started, 1e-9))
                    traced += SLICE if mode == "SDK" else 0
    finally:
        telemetry.configure()
        provider.force_flush()
        provider.shutdown()
    spans = len(exporter.get_finished_spans()) / max(traced, 1)
    return {mode: statistics.median(values) for mode, values in rates.items()}, spans


def sdk_span_cost(spans: int = 20_000) -> float:
    """The SDK's CPU seconds per span, wakeful not involved: the floor under each of a run's
    spans (span creation, context attach and detach, end, the batch processor's queue and
    export)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter(), max_queue_size=1 << 16))
    bare = provider.get_tracer("bound")
    attributes: dict[str, str | int] = {
        "db.system": "sqlite",
        "wakeful.thread_id": "t-1",
        "wakeful.step": 1,
        "x": "y",
    }
    try:
        started = time.process_time()
        for _ in range(spans):
            with bare.start_as_current_span("span", attributes=attributes):
                pass
        provider.force_flush()
        return (time.process_time() - started) / spans
    finally:
        provider.shutdown()


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.telemetry_cost")
    parser.add_argument("--runs", type=int, default=RUNS, help="graph runs per measurement")
    rounds_argument(parser, default=5)
    args = parser.parse_args(argv if argv is not None else [])
    samples: dict[tuple[str, str], list[float]] = {}
    spans_per_run = 0.0
    span_costs: list[float] = []
    for _ in range(args.rounds):
        span_costs.append(sdk_span_cost())
        with tempfile.TemporaryDirectory() as tmp:
            for store in ("memory", "sqlite"):
                url = "memory://" if store == "memory" else f"sqlite:///{Path(tmp) / 'w.db'}"
                rates, spans_per_run = asyncio.run(one_round(url, args.runs))
                for mode, rate in rates.items():
                    samples.setdefault((store, mode), []).append(rate)
    print(f"3-node graph, {args.runs} runs per mode x {args.rounds} rounds; runs per CPU second")
    span_cost = statistics.median(span_costs)
    print(f"the SDK alone: {span_cost * 1e6:.1f} us of CPU per span")
    out = Collector("telemetry_cost")
    out.add(
        "the SDK alone, CPU per span", [c * 1e6 for c in span_costs], "us", higher_is_better=False
    )
    for store in ("memory", "sqlite"):
        off = samples[(store, "off")]
        line = "  ".join(f"{m}: {statistics.median(samples[(store, m)]):,.0f}" for m in MODES)
        print(f"{store:<7} {line}")
        for mode, target in (("no SDK", 0.99), ("SDK", 0.90)):
            out.add(
                f"{store}, {mode}",
                samples[(store, mode)],
                "runs/CPU s",
                anchor=f"{store}, tracing off",
                anchor_samples=off,
                target=target,
                note=f"{spans_per_run:.0f} spans per run" if mode == "SDK" else "",
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
