"""The README's quick start and its runnable examples work as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def blocks(path: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)


FRAGMENT = "<!-- fragment"
"""Marks the next fenced block as a fragment: shown, not run (docs/decisions/0017). The
comment may say why: ``<!-- fragment: needs a running server -->``."""
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
TOOL_ARGUMENTS = {"refund": {"order_id": 42}}
"""What the local model asks of the tools the documented agents offer."""


def python_blocks(path: Path) -> list[tuple[int, str, bool]]:
    """``(line, code, is_fragment)`` of every ```python block of ``path``."""
    text = path.read_text(encoding="utf-8")
    found = []
    for match in re.finditer(r"```python\n(.*?)```", text, flags=re.S):
        before = text[: match.start()].rstrip().splitlines()
        fragment = bool(before) and before[-1].strip().startswith(FRAGMENT)
        found.append((text[: match.start()].count("\n") + 1, match.group(1), fragment))
    return found


RUNNABLE = [
    pytest.param(path, line, code, id=f"{path.name}:{line}")
    for path in DOCS
    for line, code, fragment in python_blocks(path)
    if not fragment
]


@pytest.mark.parametrize(("path", "line", "code"), RUNNABLE)
def test_every_python_block_runs_as_written(
    path: Path, line: int, code: str, tmp_path: Path
) -> None:
    """Each block not marked a fragment runs verbatim as a script, its model calls answered
    by a local OpenAI-compatible server (``OPENAI_BASE_URL``)."""
    from tests.chat_server import ChatServer

    script = tmp_path / "block.py"
    script.write_text(code, encoding="utf-8")
    with ChatServer(TOOL_ARGUMENTS) as model:
        env = {
            **os.environ,
            "OPENAI_BASE_URL": model.base_url,
            "OPENAI_API_KEY": "sk-local-test",
            "WAKEFUL_MODEL": "local-test-model",
            # this checkout's sources first (a worktree's, not the one the venv installed)
            "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT))),
        }
        done = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env=env,
        )
    assert done.returncode == 0, f"{path.name}:{line}\n{done.stderr}"
    if "# 1 (1,)" in code:
        assert done.stdout.strip() == "1 (1,)"
    if "spans.jsonl" in code:  # spans go to the file, never into the command's output
        assert "trace_id" not in done.stdout and "spans in spans.jsonl" in done.stderr
        assert (tmp_path / "spans.jsonl").read_text(encoding="utf-8").count("trace_id") >= 5


def test_readme_examples_run_and_fragments_are_rare() -> None:
    readme = python_blocks(README)
    assert readme and not any(fragment for _, _, fragment in readme)
    every = [b for path in DOCS for b in python_blocks(path)]
    assert sum(not fragment for _, _, fragment in every) >= len(every) // 3


def test_every_quick_start_command_is_a_make_target() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z]+):", makefile, flags=re.M))
    commands = [line.split("#")[0].split() for b in blocks(README, "sh") for line in b.splitlines()]
    makes = [c[1] for c in commands if len(c) == 2 and c[0] == "make"]
    assert {"demo", "test"} <= set(makes)
    assert set(makes) <= targets, set(makes) - targets


def test_the_readme_set_up_puts_wakeful_on_the_path() -> None:
    """The README's set-up block, run verbatim by ``sh`` in a shell whose PATH lacks the
    virtualenv, makes ``wakeful`` resolve to ``.venv/bin/wakeful`` (issue 34, item 4)."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Set up", 1)[1]
    setup = re.search(r"```sh\n(.*?)```", section, flags=re.S)
    assert setup is not None, "README.md has no sh block under 'Set up'"
    venv_bin = ROOT / ".venv" / "bin"
    assert (venv_bin / "wakeful").exists(), "run `make venv` first"
    bare = os.pathsep.join(
        p
        for p in os.environ.get("PATH", "").split(os.pathsep)
        if p and Path(p).resolve() not in (venv_bin.resolve(), Path(sys.executable).parent)
    )
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = bare
    before = subprocess.run(
        ["sh", "-c", "command -v wakeful"], env=env, capture_output=True, text=True
    )
    assert before.stdout.strip() != str(venv_bin / "wakeful"), "wakeful was on the PATH already"
    script = "set -e\n" + setup.group(1) + "command -v wakeful\n"
    done = subprocess.run(
        ["sh", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Usage: wakeful" in done.stdout
    resolved = Path(done.stdout.strip().splitlines()[-1])
    assert resolved.resolve() == (venv_bin / "wakeful").resolve(), done.stdout


@pytest.mark.slow
def test_make_demo_runs_as_the_readme_says() -> None:
    done = subprocess.run(["make", "demo"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAIL" not in done.stdout and "the tool ran exactly once" in done.stdout


def test_the_http_api_reference_lists_every_route_of_the_openapi_document() -> None:
    from wakeful.server import create_app
    from wakeful.store.memory import MemoryStore

    spec = create_app(MemoryStore()).openapi()
    doc = (ROOT / "docs" / "http-api.md").read_text(encoding="utf-8")
    missing = [
        f"{method.upper()} {path}"
        for path, operations in spec["paths"].items()
        for method in operations
        if f"`{method.upper()} {path}`" not in doc
    ]
    assert not missing, f"docs/http-api.md does not list {missing}"


def _wakeful_imports(code: str) -> set[tuple[str, str | None]]:
    """``(module, name)`` of every wakeful import in ``code``, a fragment too (a fragment
    that does not parse is read line by line)."""
    import ast

    try:
        tree = compile(
            code, "<doc>", "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        )
        statements = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    except SyntaxError:
        statements = []
        for line in code.splitlines():
            try:
                parsed = ast.parse(line.strip())
            except SyntaxError:
                continue
            statements += [n for n in parsed.body if isinstance(n, ast.Import | ast.ImportFrom)]
    found: set[tuple[str, str | None]] = set()
    for node in statements:
        if isinstance(node, ast.Import):
            found |= {(a.name, None) for a in node.names if a.name.split(".")[0] == "wakeful"}
        elif node.module and node.module.split(".")[0] == "wakeful":
            found |= {(node.module, a.name) for a in node.names}
    return found


NOT_PYTHON = {
    "wakeful.lock",
    "wakeful.relay",
    "wakeful.tool.execution",
    "wakeful.tool.idempotency_key",
    "wakeful.tool.outcome",
    "wakeful.tool.replay",
}
"""Dotted names in the docs that are not Python: the file store's lock file, the relay's
thread id, and the tool spans' attributes (``wakeful.tool`` is also the decorator)."""


def _dotted_names(path: Path) -> set[str]:
    """``wakeful.x.y`` names written in inline code in the prose."""
    text = path.read_text(encoding="utf-8")
    return set(re.findall(r"`(wakeful(?:\.[A-Za-z_][A-Za-z0-9_]*)+)", text)) - NOT_PYTHON


def _resolves(dotted: str) -> bool:
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(value, attr):
                return False
            value = getattr(value, attr)
        return True
    return False


def test_every_name_the_docs_import_or_name_resolves() -> None:
    missing = []
    for path in DOCS:
        for line, code, _ in python_blocks(path):
            for module, name in sorted(_wakeful_imports(code), key=str):
                target = module if name is None else f"{module}.{name}"
                if not _resolves(target):
                    missing.append(f"{path.name}:{line}: {target}")
        missing += [
            f"{path.name}: {n}"
            for n in sorted(_dotted_names(path))
            # ``wakeful.x`` that is no Python name is a span attribute or a metric's name
            if _resolves(".".join(n.split(".")[:2])) and not _resolves(n)
        ]
    assert missing == []


def test_the_name_check_catches_a_wrong_name() -> None:
    assert _resolves("wakeful.store.open_store") and _resolves("wakeful.Runtime")
    assert not _resolves("wakeful.store.no_such_thing")
    assert _wakeful_imports("from wakeful.agent import Agent\nasync with x:\n  ...") == {
        ("wakeful.agent", "Agent")
    }
