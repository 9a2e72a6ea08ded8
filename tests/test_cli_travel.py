"""Time travel on the command line (issue 37): ``threads history``, ``threads checkpoint``,
``threads update``, ``threads fork`` and ``submit --from-checkpoint``, through the real
entry point; every refusal is one ``error:`` line with its exit code."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import wakeful
from tests.cli_support import cli, error_line
from tests.test_cli_commands import APP, as_json, drain
from wakeful import open_store


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def test_history_update_fork_and_replay_from_the_command_line(url: str) -> None:
    done = cli("run", "t1", "tally", "--input", '{"numbers": [1, 2]}', "--app", APP, store=url)
    assert done.returncode == 0, done.stderr
    page = as_json(cli("threads", "history", "t1", "--json", store=url))
    assert [e["nodes"] for e in page["entries"]] == [["sum"], []]
    first = page["entries"][1]["checkpoint_id"]

    shown = cli("threads", "history", "t1", store=url)
    assert shown.returncode == 0 and page["entries"][0]["checkpoint_id"] in shown.stdout

    # edit the first checkpoint's state as if `sum` returned it: the thread branches there
    done = cli(
        "threads", "update", "t1", "--values", '{"total": 99}', "--as-node", "sum",
        "--checkpoint", first, "--app", APP, store=url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("updated t1: checkpoint update-")
    assert f"from {first}" in done.stdout
    page = as_json(cli("threads", "history", "t1", "--json", store=url))
    assert [(e["source"], e["branch"], e["current"]) for e in page["entries"]] == [
        ("update", 1, True),
        ("loop", 0, False),
        ("input", 0, True),
    ]
    assert [b["fork_point"] for b in page["branches"]] == [first]
    shown = as_json(cli("threads", "checkpoint", "t1", first, "--json", store=url))
    assert shown["checkpoint"]["state"] == {"numbers": [1, 2]} and shown["messages"] == []

    done = cli("threads", "fork", "t1", "t2", "--checkpoint", first, store=url)
    assert done.returncode == 0 and done.stdout.startswith(f"forked t1 at {first} into t2")
    again = cli("threads", "fork", "t1", "t2", store=url)
    assert again.returncode == 4 and "already in use" in error_line(again)

    # replay the original first checkpoint: a worker runs `sum` again on a new branch
    done = cli("submit", "t1", "tally", "--from-checkpoint", first, "--json", store=url)
    dispatch = as_json(done)
    assert dispatch["payload"]["from_checkpoint"] == first
    drain(url, dispatch["dispatch_id"])

    async def read() -> tuple[object, int]:
        async with open_store(url) as store:
            snap = await store.read("t1")
            assert snap is not None and snap.checkpoint is not None
            return snap.checkpoint.state, len(await wakeful.history(store, "t1"))

    state, count = asyncio.run(read())
    assert state == {"numbers": [1, 2], "total": 3} and count == 5


def test_bad_time_travel_input_is_one_error_line(url: str) -> None:
    assert cli("run", "t1", "tally", "--input", "{}", "--app", APP, store=url).returncode == 0
    update = ("threads", "update", "t1", "--app", APP)
    for args, code, words in [
        (("submit", "t1", "tally", "--from-checkpoint", "cp-none"), 3, "checkpoint 'cp-none'"),
        ((*update, "--values", "[1]"), 6, "must be a JSON object"),
        ((*update, "--values", "{", ), 6, "not valid JSON"),
        ((*update, "--values", "{}", "--as-node", "nobody"), 6, "not a node"),
        (("threads", "update", "t1", "--values", "{}"), 2, "--app"),
        (("threads", "checkpoint", "t1", "cp-none"), 3, "checkpoint 'cp-none' does not exist"),
        (("threads", "history", "nope"), 3, "thread 'nope' does not exist"),
        (("threads", "fork", "t1", "bad id"), 6, "new_thread_id"),
    ]:  # fmt: skip
        done = cli(*args, store=url)
        assert done.returncode == code, (args, done.stderr)
        assert words in error_line(done), args
