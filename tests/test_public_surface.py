"""The public surface: what ``import wakeful`` offers and costs, and a package with no import
circle."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import wakeful

SRC = Path(__file__).resolve().parent.parent / "src"

FIRST_GUESSES = {
    "open_store",
    "Graph",
    "START",
    "END",
    "Runtime",
    "ClaimPolicy",
    "Agent",
    "tool",
    "Worker",
    "Registry",
    "submit",
    "resume",
    "cancel",
    "send_message",
    "RunInProgress",
    "RunOutcome",
    "ProviderError",
    "HandUnavailable",
}


def test_all_is_pinned_and_every_name_resolves() -> None:
    exported = set(wakeful.__all__)
    assert len(exported) == len(wakeful.__all__), "no name listed twice"
    missing = FIRST_GUESSES - exported
    assert not missing, f"first guesses not exported: {sorted(missing)}"
    for name in wakeful.__all__:
        assert getattr(wakeful, name) is not None, name


def test_every_error_class_is_exported() -> None:
    import wakeful.errors as errors

    classes = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, BaseException)
    }
    assert classes - set(wakeful.__all__) == set()


def test_subpackage_paths_are_the_same_objects() -> None:
    from wakeful.agent import Agent
    from wakeful.fleet import Registry, Worker
    from wakeful.runtime import END, START, Graph, Runtime

    assert (wakeful.Agent, wakeful.Worker, wakeful.Registry) == (Agent, Worker, Registry)
    assert (wakeful.Graph, wakeful.Runtime, wakeful.START, wakeful.END) == (
        Graph,
        Runtime,
        START,
        END,
    )


def test_unknown_names_still_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchName"):
        _ = wakeful.NoSuchName


def test_import_wakeful_stays_light() -> None:
    """``import wakeful`` loads the records, errors and store opener only: the runtime,
    agents, fleet and HTTP clients load on first use of one of their names."""
    probe = (
        "import json, sys, wakeful; "
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m.startswith(('wakeful.', 'httpx', 'fastapi', 'psycopg', 'click', 'rich')))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = json.loads(done.stdout)
    heavy = [
        m
        for m in loaded
        if m.startswith(
            ("wakeful.runtime", "wakeful.agent", "wakeful.fleet", "wakeful.server", "httpx")
        )
        or m.startswith(("fastapi", "psycopg", "click", "rich"))
    ]
    assert heavy == []


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in (SRC / "wakeful").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The wakeful modules that ``name`` imports anywhere (also inside functions), leaving
    out ``if TYPE_CHECKING:`` blocks. ``from pkg import mod`` counts as importing ``mod``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for child in ast.walk(node))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parents = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parents, base] if base else parents)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {m for m in found if m in modules and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_package_has_no_import_circle() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []


def test_the_circle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


LAYERS = {
    # DESIGN.md section 2: each layer imports only the layers below it (or its own).
    "errors": 0,
    "records": 0,
    "limits": 0,  # RateLimit and the bucket arithmetic: records the stores keep (issue 39)
    "concurrency": 0,  # concurrency keys' rules and use: records the stores keep (issue 39)
    "clock": 0,
    "ids": 0,
    "metrics": 0,
    "telemetry": 0,
    "redact": 0,
    "background": 0,
    "backoff": 0,
    "store": 1,
    "testkit": 2,  # its time-travel cases run the runtime over the store (decision 0036)
    "runtime": 2,
    "providers": 3,
    "agent": 4,
    "pydantic_ai": 4,  # the PydanticAI wrapper: a graph over the runtime (issue 42)
    "fleet": 5,
    "client": 6,
    "langgraph": 6,
    "openai_agents": 6,  # the Agents SDK adapter over the agent layer (issue 42)
    "cli": 7,
    "server": 7,
    "demo": 7,
}


def _layer(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def test_no_layer_imports_a_layer_above_it() -> None:
    modules = _modules()
    upward = []
    for name, path in modules.items():
        if name == "wakeful":  # the facade: lazy names only
            continue
        for imported in _imports(name, path, modules):
            if imported == "wakeful":
                continue
            if LAYERS[_layer(imported)] > LAYERS[_layer(name)]:
                upward.append(f"{name} -> {imported}")
    assert upward == []


def test_run_outcome_repr_shows_the_shape_not_the_whole_state() -> None:
    from wakeful.runtime import RunOutcome

    outcome = RunOutcome(
        thread_id="t", run_id="r", status="completed", state={"answer": "x" * 10_000}
    )
    shown = repr(outcome)
    assert (
        shown == "RunOutcome(status='completed', thread_id='t', run_id='r', state={'answer': ...})"
    )


@pytest.mark.asyncio
async def test_scripted_is_a_documented_provider_of_the_providers_package() -> None:
    from wakeful.providers import ModelRequest, Scripted, StreamEnd, TextDelta, ToolCallDelta

    model = Scripted.replies("Hello!", "Bye.")
    items = [item async for item in model.stream(ModelRequest(model="m", messages=()))]
    assert "".join(i.text for i in items if isinstance(i, TextDelta)) == "Hello!"
    assert isinstance(items[-1], StreamEnd)
    assert len(model.requests) == 1 and len(model.turns) == 1
    turn = Scripted.calls(("c1", "lookup", {"order": 42}))
    first = turn[0]
    assert isinstance(first, ToolCallDelta) and (first.id, first.name) == ("c1", "lookup")
    assert isinstance(turn[-1], StreamEnd) and turn[-1].stop_reason == "tool_use"


def test_no_module_is_over_600_lines() -> None:
    lengths = {
        str(path.relative_to(SRC)): len(path.read_text(encoding="utf-8").splitlines())
        for path in (SRC / "wakeful").rglob("*.py")
    }
    assert {name: n for name, n in lengths.items() if n > 600} == {}


def test_one_backoff_computes_every_retry_delay() -> None:
    from wakeful.agent.recovery import StreamPolicy
    from wakeful.backoff import backoff_delay
    from wakeful.runtime.graph import RetryPolicy

    assert [backoff_delay(n, 0.5, 3.0) for n in (0, 1, 2, 3, 4)] == [0.5, 0.5, 1.0, 2.0, 3.0]
    assert backoff_delay(3, 1.0, 100.0, factor=3.0) == 9.0
    assert backoff_delay(2, 1.0, 10.0, jitter=0.25, uniform=lambda lo, hi: hi) == 2.5
    assert backoff_delay(2, 1.0, 10.0, jitter=0.25, uniform=lambda lo, hi: lo) == 1.5
    with pytest.raises(ValueError, match="jitter"):
        backoff_delay(1, 1.0, 1.0, jitter=1.5)
    # each caller keeps its documented parameters
    assert RetryPolicy(initial_delay=0.2, backoff=2.0, max_delay=10.0).delay(3) == 0.8
    for _ in range(20):
        assert 0.375 <= StreamPolicy().backoff(1, None) <= 0.625
    assert StreamPolicy().backoff(1, 7.0) == 7.0
    sources = [
        SRC / "wakeful" / path
        for path in (
            "agent/recovery.py",
            "fleet/worker.py",
            "fleet/hand.py",
            "runtime/graph.py",
            "store/postgres/listen.py",
            "client/streams.py",
        )
    ]
    for source in sources:
        text = source.read_text(encoding="utf-8")
        assert "backoff_delay(" in text and "2 **" not in text and "* 2," not in text, source
