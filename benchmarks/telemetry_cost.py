"""What tracing costs: the 3-node graph of ``runtime_graph`` (durability ``sync``, a fresh
thread per run) in runs per second on the memory and SQLite stores, with tracing turned off
(``telemetry.configure(enabled=False)``: the floor of the instrumentation), with the
OpenTelemetry API and no SDK (the default), and with the SDK recording every span into an
in-memory exporter through a ``BatchSpanProcessor`` (as production would export). Rounds
interleave the three modes. Targets: no SDK >= 0.99x and SDK >= 0.90x of tracing off.

Each run records 9 spans: the run, 3 supersteps, 3 tasks, the claim_and_commit and 3
commits."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import Collector, Result, rounds_argument
from benchmarks.runtime_graph import wakeful_rate
from wakeful import telemetry

RUNS = 300
MODES = ("off", "no SDK", "SDK")


def _sdk() -> tuple[Callable[[], None], Callable[[], int]]:
    """Configure an SDK provider with an in-memory exporter; returns (shutdown, spans)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=1 << 16))
    telemetry.configure(provider)

    def spans() -> int:
        provider.force_flush()
        return len(exporter.get_finished_spans())

    return provider.shutdown, spans


def measure(url: str, mode: str, runs: int) -> tuple[float, int]:
    """Runs per second in ``mode``, and the spans recorded."""
    shutdown, count = (lambda: None), (lambda: 0)
    if mode == "off":
        telemetry.configure(enabled=False)
    elif mode == "SDK":
        shutdown, count = _sdk()
    else:
        telemetry.configure()
    try:
        rate = asyncio.run(wakeful_rate(url, runs))
        return rate, count()
    finally:
        shutdown()
        telemetry.configure()


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.telemetry_cost")
    parser.add_argument("--runs", type=int, default=RUNS, help="graph runs per measurement")
    rounds_argument(parser, default=5)
    args = parser.parse_args(argv if argv is not None else [])
    samples: dict[tuple[str, str], list[float]] = {}
    spans_per_run = 0.0
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            for store in ("memory", "sqlite"):
                for mode in MODES:
                    url = "memory://" if store == "memory" else f"sqlite:///{Path(tmp) / mode}.db"
                    rate, spans = measure(url, mode, args.runs)
                    samples.setdefault((store, mode), []).append(rate)
                    if spans:
                        spans_per_run = spans / args.runs
    print(f"3-node graph, {args.runs} runs x {args.rounds} rounds (medians); runs/s")
    out = Collector("telemetry_cost")
    for store in ("memory", "sqlite"):
        off = samples[(store, "off")]
        line = "  ".join(f"{m}: {statistics.median(samples[(store, m)]):,.0f}" for m in MODES)
        print(f"{store:<7} {line}")
        for mode, target in (("no SDK", 0.99), ("SDK", 0.90)):
            out.add(
                f"{store}, {mode}",
                samples[(store, mode)],
                "runs/s",
                anchor=f"{store}, tracing off",
                anchor_samples=off,
                target=target,
                note=f"{spans_per_run:.0f} spans per run" if mode == "SDK" else "",
            )
    return out.results


if __name__ == "__main__":
    main(sys.argv[1:])
