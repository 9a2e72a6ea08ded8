"""A scriptable HTTP server on 127.0.0.1 that speaks the OpenAI Chat Completions and
Anthropic Messages streaming formats byte for byte, for the provider adapter tests.

Each request takes the next scripted ``Reply``; every request's path, headers and JSON body
are recorded. ``close()`` releases stalled and gated handlers, stops the server and joins
every handler thread."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import tomllib
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

SSE_TYPE = "text/event-stream; charset=utf-8"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "providers"


@dataclass
class Reply:
    """One scripted response. With ``events`` (SSE frames) it streams them with chunked or
    connection-close framing; otherwise it sends ``body`` with a Content-Length.

    ``drop_after=n`` sends n events and then cuts the connection: ``"fin"`` closes it without
    the terminating chunk; ``"rst"`` first waits for ``ProviderServer.release`` (so the client
    has read what came before) and then resets it. ``stall_after=n`` sends n events and then
    nothing until the server is released or closed. ``chunk_size`` splits every frame into
    chunks of that many bytes (splitting UTF-8 characters and CRLF pairs)."""

    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    events: list[bytes] | None = None
    body: bytes = b""
    content_type: str = "application/json"
    framing: Literal["chunked", "close"] = "chunked"
    drop_after: int | None = None
    drop: Literal["fin", "rst"] = "fin"
    stall_after: int | None = None
    chunk_size: int | None = None
    pace: float = 0.0
    """Seconds between two events (a model writing slowly)."""
    gate_after: int | None = None
    """Send this many events, wait for ``ProviderServer.release``, then send the rest (a
    stream held open until the test lets it go)."""


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: Any


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins every handler thread
    block_on_close = True
    owner: ProviderServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away mid-response is part of the script


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        owner = self.server.owner
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        owner._record(self.path, dict(self.headers.items()), raw)
        reply = owner._next()
        self.close_connection = True
        self.send_response(reply.status)
        for name, value in reply.headers:
            self.send_header(name, value)
        self.send_header("Connection", "close")
        if reply.events is None:
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
            return
        self.send_header("Content-Type", SSE_TYPE)
        self.send_header("Cache-Control", "no-cache")
        if reply.framing == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i, frame in enumerate(reply.events):
            if i == reply.drop_after:
                return self._cut(reply.drop, owner.release)
            if i == reply.stall_after:
                owner.release.wait(timeout=30)
                return None
            if i == reply.gate_after:
                owner.release.wait(timeout=30)
            if reply.pace and i:
                time.sleep(reply.pace)
            try:
                self._send(frame, reply)
            except OSError:
                return None  # the client went away (a worker killed mid-reply)
        if reply.drop_after == len(reply.events):
            return self._cut(reply.drop, owner.release)
        if reply.stall_after == len(reply.events):
            owner.release.wait(timeout=30)
            return None
        if reply.framing == "chunked":
            self.wfile.write(b"0\r\n\r\n")
        return None

    do_GET = do_POST  # a GET (``/models``) takes the next scripted reply too

    def _send(self, frame: bytes, reply: Reply) -> None:
        size = reply.chunk_size or len(frame)
        for start in range(0, len(frame), size):
            piece = frame[start : start + size]
            if reply.framing == "chunked":
                piece = b"%x\r\n%s\r\n" % (len(piece), piece)
            self.wfile.write(piece)

    def _cut(self, how: str, release: threading.Event) -> None:
        if how == "fin":
            return  # the connection closes without the terminating chunk
        release.wait(timeout=30)
        self.rfile.close()  # drop the makefile reference so close() really closes
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()  # linger 0: the peer gets a reset


class ProviderServer:
    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.received: list[Received] = []
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def push(self, *replies: Reply) -> None:
        with self._lock:
            self.replies.extend(replies)

    def _next(self) -> Reply:
        with self._lock:
            if self.replies:
                return self.replies.popleft()
        return Reply(status=599, body=b'{"error": {"type": "no_scripted_reply"}}')

    def _record(self, path: str, headers: dict[str, str], raw: bytes) -> None:
        with self._lock:
            lowered = {k.lower(): v for k, v in headers.items()}
            self.received.append(Received(path, lowered, json.loads(raw) if raw else None))

    @property
    def bodies(self) -> list[Any]:
        with self._lock:
            return [r.body for r in self.received]

    def close(self) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# ------------------------------------------------------------------------- wire formats


def sse(data: Any, event: str | None = None) -> bytes:
    """One SSE frame; ``data`` is JSON-encoded compactly unless it is already a string."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


_CHUNK_BASE = {
    "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
    "object": "chat.completion.chunk",
    "created": 1741570283,
    "model": "gpt-4o-2024-08-06",
    "system_fingerprint": "fp_eb9dce56a8",
}


def openai_chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return sse({**_CHUNK_BASE, "choices": [choice], "usage": None})


def openai_usage(prompt: int, completion: int) -> bytes:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    usage["total_tokens"] = prompt + completion
    return sse({**_CHUNK_BASE, "choices": [], "usage": usage})


def openai_text(
    *parts: str, finish: str = "stop", usage: tuple[int, int] = (19, 10)
) -> list[bytes]:
    """role chunk, one chunk per part, the finish chunk, the usage chunk, [DONE]."""
    return [
        openai_chunk({"role": "assistant", "content": "", "refusal": None}),
        *(openai_chunk({"content": part}) for part in parts),
        openai_chunk({}, finish),
        openai_usage(*usage),
        b"data: [DONE]\n\n",
    ]


def openai_tool(
    index: int, id: str | None = None, name: str | None = None, args: str = ""
) -> bytes:
    call: dict[str, Any] = {"index": index}
    if id is not None:
        call |= {"id": id, "type": "function"}
    call["function"] = (
        {"name": name, "arguments": args} if name is not None else {"arguments": args}
    )
    return openai_chunk({"tool_calls": [call]})


def openai_error(type: str | None, code: str | None = None, message: str = "error") -> bytes:
    error = {"message": message, "type": type, "param": None, "code": code}
    return json.dumps({"error": error}, indent=4).encode()


def anthropic_start(input_tokens: int = 25) -> bytes:
    message: dict[str, Any] = {
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1},
    }
    return sse({"type": "message_start", "message": message}, "message_start")


def anthropic_block_start(index: int, block: dict[str, Any]) -> bytes:
    data = {"type": "content_block_start", "index": index, "content_block": block}
    return sse(data, "content_block_start")


def anthropic_delta(index: int, delta: dict[str, Any]) -> bytes:
    data = {"type": "content_block_delta", "index": index, "delta": delta}
    return sse(data, "content_block_delta")


def anthropic_block_stop(index: int) -> bytes:
    return sse({"type": "content_block_stop", "index": index}, "content_block_stop")


def anthropic_end(stop_reason: str, output_tokens: int = 15) -> list[bytes]:
    delta = {"stop_reason": stop_reason, "stop_sequence": None}
    message_delta = {
        "type": "message_delta",
        "delta": delta,
        "usage": {"output_tokens": output_tokens},
    }
    return [
        sse(message_delta, "message_delta"),
        sse({"type": "message_stop"}, "message_stop"),
    ]


ANTHROPIC_PING = b'event: ping\ndata: {"type": "ping"}\n\n'


def anthropic_text(*parts: str, stop: str = "end_turn") -> list[bytes]:
    """message_start, a text block with one delta per part (and a ping), the end."""
    return [
        anthropic_start(),
        anthropic_block_start(0, {"type": "text", "text": ""}),
        ANTHROPIC_PING,
        *(anthropic_delta(0, {"type": "text_delta", "text": part}) for part in parts),
        anthropic_block_stop(0),
        *anthropic_end(stop),
    ]


def anthropic_tool_start(index: int, id: str, name: str) -> bytes:
    return anthropic_block_start(index, {"type": "tool_use", "id": id, "name": name, "input": {}})


def anthropic_json(index: int, partial: str) -> bytes:
    return anthropic_delta(index, {"type": "input_json_delta", "partial_json": partial})


def anthropic_error(type: str, message: str = "error") -> bytes:
    body = {"type": "error", "error": {"type": type, "message": message}}
    return json.dumps({**body, "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy"}).encode()


def anthropic_error_event(type: str, message: str = "error") -> bytes:
    return sse({"type": "error", "error": {"type": type, "message": message}}, "error")


# ------------------------------------------------------------------ replayed fixtures


@dataclass(frozen=True)
class Fixture:
    """A recorded response of one server: ``<server>/<name>.sse`` (a stream body) or
    ``<server>/<name>.json`` (a plain body), byte for byte, and ``<name>.toml``: the quirk,
    its source, the response status and headers, and what the adapter must make of it."""

    server: str
    name: str
    body: bytes
    streamed: bool
    meta: dict[str, Any]

    @property
    def id(self) -> str:
        return f"{self.server}/{self.name}"

    def reply(self, chunk_size: int | None = None) -> Reply:
        """The fixture served as recorded; ``chunk_size`` splits the body into chunks of
        that many bytes."""
        response = self.meta.get("response", {})
        headers = [(str(k), str(v)) for k, v in response.get("headers", [])]
        status = int(response.get("status", 200))
        if self.streamed:
            return Reply(status=status, headers=headers, events=[self.body], chunk_size=chunk_size)
        content_type = str(response.get("content_type", "application/json"))
        return Reply(status=status, headers=headers, body=self.body, content_type=content_type)


def fixtures() -> list[Fixture]:
    """Every recorded response under ``tests/fixtures/providers``."""
    found = []
    for meta_path in sorted(FIXTURES.glob("*/*.toml")):
        stream_path = meta_path.with_suffix(".sse")
        body_path = stream_path if stream_path.exists() else meta_path.with_suffix(".json")
        found.append(
            Fixture(
                server=meta_path.parent.name,
                name=meta_path.stem,
                body=body_path.read_bytes(),
                streamed=body_path is stream_path,
                meta=tomllib.loads(meta_path.read_text()),
            )
        )
    return found


def recorded(id: str) -> Fixture:
    """One fixture by ``server/name``."""
    [found] = [f for f in fixtures() if f.id == id]
    return found
