"""``wakeful providers check`` through the real entry point against the local wire-format
server: a good endpoint, one without tool support, one that errors, an unreachable URL, model
discovery and bad input."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.provider_server import (
    ProviderServer,
    Reply,
    openai_chunk,
    openai_error,
    openai_text,
    openai_tool,
    openai_usage,
    recorded,
)

ROOT = Path(__file__).resolve().parent.parent
WAKEFUL = str(Path(sys.executable).parent / "wakeful")
DONE = b"data: [DONE]\n\n"
TOOL_TURN = [
    openai_chunk({"role": "assistant", "content": None}),
    openai_tool(0, "call_1", "get_time", ""),
    openai_tool(0, args='{"tz": '),
    openai_tool(0, args='"UTC"}'),
    openai_chunk({}, "tool_calls"),
    openai_usage(60, 12),
    DONE,
]


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as srv:
        yield srv


def check(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "COLUMNS": "200",
        "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT))),
        **env,
    }
    return subprocess.run(
        [WAKEFUL, "providers", "check", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
        cwd=ROOT,
    )


def report(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(done.stdout)
    data["by_name"] = {c["name"]: c for c in data["checks"]}
    return data


def test_a_good_endpoint_is_usable(server: ProviderServer) -> None:
    headers = [("x-request-id", "req_7"), ("x-ratelimit-remaining-requests", "99")]
    server.push(Reply(events=openai_text("Hello"), headers=headers), Reply(events=TOOL_TURN))
    done = check(
        "--base-url",
        f"{server.url}/v1/",
        "--model",
        "m-1",
        "--api-key-env",
        "CHECK_KEY",
        "--json",
        CHECK_KEY="sk-check",
    )
    assert done.returncode == 0, done.stderr
    data = report(done)
    assert (data["verdict"], data["model"]) == ("usable", "m-1")
    assert data["by_name"]["tool calls"]["detail"] == 'get_time({"tz": "UTC"})'
    assert data["by_name"]["usage"]["detail"] == "19 in, 10 out"
    assert data["by_name"]["request id"]["detail"] == "req_7"
    assert "x-ratelimit-remaining-requests: 99" in data["by_name"]["retry hints"]["detail"]
    first, second = server.received
    assert first.path == second.path == "/v1/chat/completions"
    assert first.headers["authorization"] == "Bearer sk-check"
    assert "tools" not in first.body and second.body["tools"][0]["function"]["name"] == "get_time"
    assert first.body["stream"] is True and first.body["model"] == "m-1"


def test_the_human_report_is_a_table_and_a_verdict(server: ProviderServer) -> None:
    server.push(Reply(events=openai_text("Hello")), Reply(events=TOOL_TURN))
    done = check("--base-url", f"{server.url}/v1", "--model", "m-1", OPENAI_API_KEY="sk-secret")
    assert done.returncode == 0, done.stderr
    for row in ("streamed text", "tool calls", "retry hints", "workarounds"):
        assert row in done.stdout
    assert done.stderr.strip() == "usable: streams text and tool calls"
    assert all("authorization" not in r.headers for r in server.received), "no key unless asked"


def test_an_endpoint_without_tool_support_is_usable_for_text_only(server: ProviderServer) -> None:
    refusal = openai_error(
        "BadRequestError",
        None,
        '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
    )
    server.push(Reply(events=openai_text("Hello")), Reply(status=400, body=refusal))
    done = check("--base-url", f"{server.url}/v1", "--model", "m-1", "--json")
    assert done.returncode == 7, done.stderr
    data = report(done)
    assert data["verdict"] == "text_only"
    tools = data["by_name"]["tool calls"]
    assert tools["ok"] is False and "enable-auto-tool-choice" in tools["detail"]
    assert "invalid_request (HTTP 400, permanent)" in tools["detail"]


def test_a_model_that_answers_instead_of_calling_is_text_only(server: ProviderServer) -> None:
    server.push(Reply(events=openai_text("Hello")), Reply(events=openai_text("It is noon.")))
    done = check("--base-url", f"{server.url}/v1", "--model", "m-1", "--json")
    assert done.returncode == 7
    assert "answered with text" in report(done)["by_name"]["tool calls"]["detail"]


@pytest.mark.parametrize(
    ("reply", "fragment"),
    [
        (Reply(status=401, body=openai_error("invalid_request_error", "invalid_api_key")), "auth"),
        (recorded("lmstudio/wrong_endpoint").reply(), "Unexpected endpoint or method"),
        (recorded("openrouter/mid_stream_error").reply(), "Provider disconnected"),
    ],
    ids=["401", "lmstudio-wrong-path", "openrouter-mid-stream-error"],
)
def test_an_endpoint_that_errors_is_not_usable(
    server: ProviderServer, reply: Reply, fragment: str
) -> None:
    server.push(reply)
    done = check("--base-url", f"{server.url}/v1", "--model", "m-1", "--json")
    assert done.returncode == 1, done.stderr
    data = report(done)
    assert data["verdict"] == "unusable"
    assert fragment in data["by_name"]["streamed text"]["detail"]
    assert len(server.received) == 1, "no tool probe after a failed text probe"


def test_an_unreachable_url() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = check("--base-url", f"http://127.0.0.1:{port}/v1", "--model", "m-1")
    assert done.returncode == 5
    assert "ConnectError" in done.stdout
    assert done.stderr.strip() == "not usable: nothing answered"


def test_without_a_model_the_first_listed_one_is_used(server: ProviderServer) -> None:
    listing = (
        b'{"object":"list","data":[{"id":"qwen2.5:7b","object":"model","owned_by":"library"}]}'
    )
    server.push(Reply(body=listing), Reply(events=openai_text("Hi")), Reply(events=TOOL_TURN))
    done = check("--base-url", f"{server.url}/v1", "--json")
    assert done.returncode == 0, done.stderr
    assert report(done)["model"] == "qwen2.5:7b"
    assert server.received[0].path == "/v1/models"
    assert server.bodies[1]["model"] == server.bodies[2]["model"] == "qwen2.5:7b"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--base-url", "ftp://example.com/v1"], "not an http(s) URL"),
        (["--base-url", "localhost:8000"], "not an http(s) URL"),
        (["--base-url", "http://127.0.0.1:9/v1", "--timeout", "0"], "timeout"),
        (["--base-url", "http://127.0.0.1:9/v1", "--api-key-env", "NO_SUCH_VAR"], "NO_SUCH"),
    ],
    ids=["scheme", "no-scheme", "timeout", "unset-key"],
)
def test_bad_input_is_one_error_line(args: list[str], message: str) -> None:
    done = check(*args, NO_SUCH_VAR="")
    assert done.returncode == 6
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("error: ") and message in line
