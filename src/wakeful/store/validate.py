"""Input validation at the store boundary, shared by every backend.

Each function checks a caller's value before any storage is touched and returns a detached
copy decoded from its JSON form: types are enforced (msgspec does not validate on
construction), mutable payloads can no longer be changed by the caller, and what is stored
is exactly what a reader will get back.

Values are refused, never changed: JSON has no NaN or infinity (an encoder would silently
write ``null``), and a value nested deeper than ``MAX_JSON_DEPTH`` is refused before it is
stored, so every reader (the stores' decoders, the HTTP API's serializer) can read it back.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, TypeVar

import msgspec

from wakeful.errors import InvalidInput, StreamCheckpointError, WakefulError
from wakeful.ids import (
    MAX_AGE_SECONDS,
    check_aware,
    check_count,
    check_id,
    check_optional_id,
    check_seconds,
)
from wakeful.records import Awaiting, Commit, Done, RetentionPolicy, Retry, StreamCheckpoint

_OPTIONAL_HASHED = ("drop_checkpoints", "branch_from", "branch_messages")
"""Fields hashed only when set: a commit without them hashes as before they existed."""
_HASHED = tuple(name for name in Commit.__struct_fields__ if name not in _OPTIONAL_HASHED)


def payload_hash(commit: Commit) -> str:
    """The hash that identifies an operation's payload: everything but the token, with
    object keys sorted so equal JSON hashes equal."""
    # Its fields as a dict, values as they are (no builtin copy: sorted encoding sorts the
    # keys inside them too). A commit that drops nothing hashes as it did before
    # ``drop_checkpoints`` existed: receipts of older versions still answer their retries.
    fields = {name: getattr(commit, name) for name in _HASHED}
    fields["token"] = 0
    if commit.drop_checkpoints:
        fields["drop_checkpoints"] = commit.drop_checkpoints
    if commit.branch_from is not None:
        fields["branch_from"] = commit.branch_from
        fields["branch_messages"] = commit.branch_messages
    return hashlib.sha256(msgspec.json.encode(fields, order="sorted")).hexdigest()


MAX_COMMIT_BYTES = 16 * 1024 * 1024
MAX_DISPATCH_BYTES = 1024 * 1024
MAX_STREAM_CHECKPOINT_BYTES = 8 * 1024 * 1024
MAX_TEXT = 10_000
MAX_JSON_DEPTH = 64
"""How many arrays and objects a stored JSON value (a state, an input, a payload, an event's
data ...) may nest. Real agent data stays far below it (a tool's JSON schema nests about 10);
the readers fail much deeper (Python's and msgspec's decoders near 1000 levels, the HTTP
API's serializer near 255, and a response wraps a value in up to four more levels), so a
value within the limit always reads back. An HTTP request body has the same limit as a whole:
the dispatch it becomes nests its input exactly as the body does."""

T = TypeVar("T")


class _Refused(Exception):
    def __init__(self, problem: str) -> None:
        self.problem = problem


_SCALARS = (str, int, bool, type(None))
_TOO_DEEP = f"nests deeper than {MAX_JSON_DEPTH} arrays/objects (the limit)"


def _scan(value: Any, depth: int) -> None:
    kind = type(value)
    if kind is dict or kind is list or kind is tuple:
        if depth >= MAX_JSON_DEPTH:
            raise _Refused(_TOO_DEEP)
        for item in value.values() if kind is dict else value:
            if type(item) not in _SCALARS:  # most items: skip the call
                _scan(item, depth + 1)
    elif kind is float:
        if not math.isfinite(value):
            raise _Refused(f"contains {value!r}, which JSON cannot represent")
    elif kind not in _SCALARS:
        try:  # a Struct, dataclass, set, datetime ...: scan its JSON form
            builtin = msgspec.to_builtins(value)
        except (TypeError, ValueError, OverflowError, RecursionError):
            return  # not JSON at all: the encoder names the problem
        if type(builtin) is not kind:
            _scan(builtin, depth)


def check_json(field: str, value: Any) -> Any:
    """Refuse ``value`` (``InvalidInput``) if storing it as JSON would change it or make it
    unreadable: a NaN or infinite float anywhere in it, or more than ``MAX_JSON_DEPTH``
    nested arrays/objects. Returns ``value``."""
    try:
        _scan(value, 0)
    except _Refused as refused:
        raise InvalidInput(field, refused.problem) from None
    except RecursionError:
        raise InvalidInput(field, f"nests deeper than {MAX_JSON_DEPTH} arrays/objects") from None
    return value


def json_roundtrip(field: str, value: T, type_: type[T], limit: int) -> T:
    """Encode ``value`` as JSON, enforce ``limit`` bytes, decode it back as ``type_``."""
    try:
        body = msgspec.json.encode(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidInput(field, f"is not JSON-encodable: {exc}") from None
    except RecursionError:
        raise InvalidInput(field, f"nests deeper than {MAX_JSON_DEPTH} arrays/objects") from None
    if len(body) > limit:
        raise InvalidInput(field, f"is {len(body)} bytes as JSON; the limit is {limit}")
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as exc:
        raise InvalidInput(field, str(exc)) from None


class _Parts(msgspec.Struct, kw_only=True):
    """The parts of a commit's JSON that the stores write, as the exact bytes encoded."""

    checkpoint: msgspec.Raw = msgspec.Raw(b"null")
    writes: tuple[msgspec.Raw, ...] = ()
    events: tuple[msgspec.Raw, ...] = ()
    messages: tuple[msgspec.Raw, ...] = ()
    outbox: tuple[msgspec.Raw, ...] = ()


class _Data(msgspec.Struct):
    data: msgspec.Raw


class _Payload(msgspec.Struct):
    payload: msgspec.Raw


_COMMIT = msgspec.json.Decoder(Commit)
_PARTS = msgspec.json.Decoder(_Parts)
_DATA = msgspec.json.Decoder(_Data)
_PAYLOAD = msgspec.json.Decoder(_Payload)
_STREAM = msgspec.json.Decoder(StreamCheckpoint)
_encode = msgspec.json.Encoder().encode


def _text(raw: msgspec.Raw) -> str:
    return str(memoryview(raw), "utf-8")


class EncodedCommit:
    """A checked commit and its one JSON encoding.

    ``commit`` is the detached, validated copy (decoded from ``body``); the ``*_texts``
    methods give the JSON text of its parts cut from ``body``, the very bytes a reader
    decodes, so no store encodes a commit's values a second time."""

    __slots__ = ("_parts", "body", "commit")

    def __init__(self, commit: Commit, body: bytes) -> None:
        self.commit = commit
        self.body = body
        self._parts: _Parts | None = None

    def with_token(self, token: int) -> EncodedCommit:
        """The same commit under ``token`` (``claim_and_commit``'s granted claim). The
        token is the encoding's first member: ``{"token":N,...``."""
        rest = self.body[self.body.index(b",") :]
        body = b'{"token":' + str(token).encode() + rest
        return EncodedCommit(msgspec.structs.replace(self.commit, token=token), body)

    @property
    def parts(self) -> _Parts:
        if self._parts is None:
            self._parts = _PARTS.decode(self.body)
        return self._parts

    def checkpoint_text(self) -> str | None:
        return None if self.commit.checkpoint is None else _text(self.parts.checkpoint)

    def write_texts(self) -> list[str]:
        return [_text(raw) for raw in self.parts.writes]

    def event_texts(self) -> list[str]:
        return [_text(raw) for raw in self.parts.events]

    def event_data_texts(self) -> list[str]:
        """Each event's ``data`` alone."""
        return [_text(_DATA.decode(raw).data) for raw in self.parts.events]

    def message_texts(self) -> list[str]:
        return [_text(raw) for raw in self.parts.messages]

    def outbox_texts(self) -> list[str]:
        return [_text(raw) for raw in self.parts.outbox]

    def outbox_payload_texts(self) -> list[str]:
        """Each outbox entry's ``payload`` alone."""
        return [_text(_PAYLOAD.decode(raw).payload) for raw in self.parts.outbox]


Values = Callable[[Any], Iterator[tuple[str, Any]]]
"""The free-form JSON values of a record, named for an error message."""


def _encoded(field: str, value: Any, limit: int, values: Values) -> bytes:
    """``value``'s JSON, at most ``limit`` bytes. On a refusal the scan of its free-form
    ``values`` speaks first, as it always did (a NaN is named before the size)."""
    try:
        body = _encode(value)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        _scan_all(values(value))
        if isinstance(exc, RecursionError):
            raise InvalidInput(
                field, f"nests deeper than {MAX_JSON_DEPTH} arrays/objects"
            ) from None
        raise InvalidInput(field, f"is not JSON-encodable: {exc}") from None
    if len(body) > limit:
        _scan_all(values(value))
        raise InvalidInput(field, f"is {len(body)} bytes as JSON; the limit is {limit}")
    return body


def _scan_all(values: Iterator[tuple[str, Any]]) -> None:
    for field, value in values:
        check_json(field, value)


def _decoded(
    field: str, body: bytes, decoder: msgspec.json.Decoder[T], original: T, values: Values
) -> T:
    """``body`` decoded (the detached, typed copy), with the JSON values checked: when the
    copy equals ``original`` (a C-level comparison) nothing was changed by the encoding, so
    it held no NaN or infinity (written as ``null``), and only the depth is left to check,
    on the copy (plain lists and dicts); otherwise the values are scanned as given."""
    try:
        copy = decoder.decode(body)
    except (msgspec.ValidationError, RecursionError) as exc:
        _scan_all(values(original))
        problem = _TOO_DEEP if isinstance(exc, RecursionError) else str(exc)
        raise InvalidInput(field, problem) from None
    try:
        same = copy == original
    except Exception:  # far too deep (the scan says so), or a value's own __eq__ failed
        same = False
    if not same:
        _scan_all(values(original))
    elif len(body) > _FEW_BRACKETS or len(body.translate(None, _NOT_OPENING)) > MAX_JSON_DEPTH:
        for name, value in values(copy):
            if not _shallow(value):
                raise InvalidInput(name, _TOO_DEEP)
    return copy


def _shallow(value: Any) -> bool:
    """Whether ``value`` (decoded JSON: dicts, lists, scalars) nests at most
    ``MAX_JSON_DEPTH`` arrays/objects: level by level, each a list of the one above's
    items (no call per container, as ``_scan`` makes)."""
    level = [value]
    for _ in range(MAX_JSON_DEPTH + 1):
        level = [
            item
            for node in level
            if type(node) is dict or type(node) is list
            for item in (node.values() if type(node) is dict else node)
        ]
        if not level:
            return True
    return False


_FEW_BRACKETS = 16 * 1024
"""A body up to this size is first searched for brackets: with at most ``MAX_JSON_DEPTH``
of them (a small commit's usual case), nothing in it can nest deeper."""

_NOT_OPENING = bytes(set(range(256)) - set(b"{["))
"""Every byte but ``{`` and ``[``: ``body.translate(None, _NOT_OPENING)`` keeps the opening
brackets alone, so its length is their count, in one pass over the body (two ``count``
calls take two: 2.7 against 1.25 µs on a 2 KB commit)."""


def encode_commit(thread_id: str, commit: Commit) -> EncodedCommit:
    """Validate a commit's shape and ids; returns the detached copy with its encoding."""
    check_id("thread_id", thread_id)
    if not isinstance(commit, Commit):
        raise InvalidInput("commit", f"must be a Commit, got {type(commit).__name__}")
    body = _encoded("commit", commit, MAX_COMMIT_BYTES, _commit_values)
    copy = _decoded("commit", body, _COMMIT, commit, _commit_values)
    check_optional_id("operation_id", copy.operation_id)
    if copy.expected_version is not None and copy.expected_version < 0:
        raise InvalidInput("expected_version", "must be >= 0")
    if copy.checkpoint is not None:
        cp = copy.checkpoint
        check_id("checkpoint.id", cp.id)
        check_optional_id("checkpoint.parent", cp.parent)
        check_id("checkpoint.run_id", cp.run_id)
        check_optional_id("checkpoint.tenant", cp.tenant)
        check_aware("checkpoint.created_at", cp.created_at)
    for write in copy.writes:
        check_id("write.checkpoint_id", write.checkpoint_id)
        check_id("write.task_id", write.task_id)
        check_text("write.node", write.node)
    for draft in copy.events:
        check_text("event.type", draft.type)
        check_optional_id("event.run_id", draft.run_id)
        check_optional_id("event.checkpoint_id", draft.checkpoint_id)
        check_optional_id("event.task_id", draft.task_id)
    for message in copy.messages:
        check_id("message.id", message.id)
        check_optional_id("message.run_id", message.run_id)
        check_optional_id("message.tool_call_id", message.tool_call_id)
    for entry in copy.outbox:
        check_id("outbox.message_id", entry.message_id)
        check_id("outbox.target_thread", entry.target_thread)
        check_optional_id("outbox.correlation_id", entry.correlation_id)
    for message_id in copy.consume:
        check_id("consume", message_id)
    if copy.settle is not None:
        check_id("settle.dispatch_id", copy.settle.dispatch_id)
        check_outcome(copy.settle.outcome)
    if copy.drop_checkpoints:
        for checkpoint_id in copy.drop_checkpoints:
            check_id("drop_checkpoints", checkpoint_id)
        if len(set(copy.drop_checkpoints)) != len(copy.drop_checkpoints):
            raise InvalidInput("drop_checkpoints", "names a checkpoint more than once")
    _check_branch(copy)
    return EncodedCommit(copy, body)


def _check_branch(commit: Commit) -> None:
    """A branching commit's shape: a new checkpoint whose parent is ``branch_from``."""
    if commit.branch_from is None:
        if commit.branch_messages != 0:
            raise InvalidInput("branch_messages", "is only meaningful with branch_from")
        return
    check_id("branch_from", commit.branch_from)
    if commit.branch_messages < 0 or commit.branch_messages > 2**62:
        raise InvalidInput("branch_messages", "must be a count >= 0")
    cp = commit.checkpoint
    if cp is None:
        raise InvalidInput("branch_from", "needs a new checkpoint to start the branch with")
    if cp.parent != commit.branch_from:
        raise InvalidInput(
            "branch_from",
            f"names {commit.branch_from!r} but the new checkpoint's parent is {cp.parent!r}: "
            "a branch's first checkpoint continues from its fork point",
        )
    if commit.branch_from in commit.drop_checkpoints:
        raise InvalidInput("drop_checkpoints", "cannot drop the fork point of the branch")


def check_commit(thread_id: str, commit: Commit) -> Commit:
    """Validate a commit's shape and ids; returns the detached copy."""
    return encode_commit(thread_id, commit).commit


def drop_refusal(checkpoint_id: str, resulting: str | None) -> str:
    """Why ``InvalidCommit`` refuses to drop ``checkpoint_id`` (one wording for every
    backend)."""
    if checkpoint_id == resulting:
        return (
            f"checkpoint {checkpoint_id!r} would be the latest after this commit; "
            "it cannot be dropped"
        )
    return f"checkpoint {checkpoint_id!r} is not in the thread's history; nothing to drop"


def _commit_values(commit: Commit) -> Iterator[tuple[str, Any]]:
    """The free-form JSON values of a commit, named for an error message."""
    cp = commit.checkpoint
    if cp is not None:
        yield "checkpoint.state", cp.state
        yield "checkpoint.frontier", cp.frontier
        yield "checkpoint.metadata", cp.metadata
    for write in commit.writes:
        yield "write.value", write.value
    for draft in commit.events:
        yield "event.data", draft.data
    for message in commit.messages:
        yield "message.content", message.content
        yield "message.tool_calls", message.tool_calls
        yield "message.metadata", message.metadata
    for entry in commit.outbox:
        yield "outbox.payload", entry.payload


def check_claim_and_commit(
    thread_id: str, holder: str, ttl: float, commit: Commit
) -> tuple[float, Commit]:
    """``claim_and_commit``'s arguments: the checked ttl and the detached commit (whose
    token the store ignores: the claim it grants supplies it)."""
    ttl, encoded = encode_claim_and_commit(thread_id, holder, ttl, commit)
    return ttl, encoded.commit


def encode_claim_and_commit(
    thread_id: str, holder: str, ttl: float, commit: Commit
) -> tuple[float, EncodedCommit]:
    """``check_claim_and_commit`` with the commit's encoding."""
    check_id("holder", holder)
    return check_seconds("ttl", ttl), encode_commit(thread_id, commit)


def check_outcome(outcome: object) -> tuple[str, float, str | None]:
    """A settle outcome as ``(status, retry delay, retry error)``: the dispatch status it
    leads to (``pending`` for a retry), ``0.0`` and ``None`` but for a retry."""
    if isinstance(outcome, Retry):
        delay = check_seconds("retry delay", outcome.delay, allow_zero=True)
        if outcome.error is not None:
            check_text("retry error", outcome.error)
        return "pending", delay, outcome.error
    if isinstance(outcome, Done):
        return "done", 0.0, None
    if isinstance(outcome, Awaiting):
        return "awaiting", 0.0, None
    raise InvalidInput("outcome", "must be Done(), Awaiting() or Retry(delay, error)")


def _stream_values(checkpoint: StreamCheckpoint) -> Iterator[tuple[str, Any]]:
    yield "tool_calls", checkpoint.tool_calls
    yield "in_flight_tool", checkpoint.in_flight_tool


class EncodedStreamCheckpoint:
    """A checked stream checkpoint and its one JSON encoding (``body``, what is stored)."""

    __slots__ = ("body", "checkpoint")

    def __init__(self, checkpoint: StreamCheckpoint, body: bytes) -> None:
        self.checkpoint = checkpoint
        self.body = body

    def stamped(self, at: datetime) -> EncodedStreamCheckpoint:
        """With ``updated_at`` set to ``at`` unless the caller set it. Only ``task_id`` and
        ``message_id`` (a string or null each, whose text cannot hold an unescaped quote)
        follow ``updated_at`` in the encoding, so its last ``"updated_at":null,"task_id":``
        is the member itself."""
        if self.checkpoint.updated_at is not None:
            return self
        cut = self.body.rindex(_UNSTAMPED)
        body = b"".join(
            (self.body[:cut], b'"updated_at":', _encode(at), self.body[cut + _NULL_AT :])
        )
        return EncodedStreamCheckpoint(
            msgspec.structs.replace(self.checkpoint, updated_at=at), body
        )


_UNSTAMPED = b'"updated_at":null,"task_id":'
_NULL_AT = len(b'"updated_at":null')


def encode_stream_checkpoint(checkpoint: StreamCheckpoint) -> EncodedStreamCheckpoint:
    """Validate a stream checkpoint; returns the detached copy with its encoding."""
    if not isinstance(checkpoint, StreamCheckpoint):
        raise InvalidInput(
            "checkpoint", f"must be a StreamCheckpoint, got {type(checkpoint).__name__}"
        )
    field = "stream checkpoint"
    body = _encoded(field, checkpoint, MAX_STREAM_CHECKPOINT_BYTES, _stream_values)
    copy = _decoded(field, body, _STREAM, checkpoint, _stream_values)
    check_id("run_id", copy.run_id)
    check_id("thread_id", copy.thread_id)
    check_text("model", copy.model)
    check_optional_id("task_id", copy.task_id)
    if copy.updated_at is not None:
        check_aware("updated_at", copy.updated_at)
    return EncodedStreamCheckpoint(copy, body)


def check_stream_checkpoint(checkpoint: StreamCheckpoint) -> StreamCheckpoint:
    """Validate a stream checkpoint; returns the detached copy."""
    return encode_stream_checkpoint(checkpoint).checkpoint


def discards(saved: StreamCheckpoint | None, task_id: str, token: int) -> bool:
    """Whether ``StreamCheckpointStore.discard(run_id, task_id, token)`` removes ``saved``:
    the checkpoint of that turn, written under a claim token not above ``token``."""
    return saved is not None and saved.task_id == task_id and saved.token <= token


def check_discard(run_id: str, task_id: str, token: int) -> None:
    """The arguments of ``StreamCheckpointStore.discard``; refused as that store's every
    failure is, with ``StreamCheckpointError`` (``invalid``)."""
    try:
        check_id("run_id", run_id)
        check_id("task_id", task_id)
        check_token(token)
    except WakefulError as exc:
        raise StreamCheckpointError(str(run_id)[:40], "invalid", str(exc)) from exc


def check_text(field: str, value: Any, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str):
        raise InvalidInput(field, f"must be a string, got {type(value).__name__}")
    if len(value) > limit:
        raise InvalidInput(field, f"is {len(value)} characters long; the limit is {limit}")
    return value


def canonical(value: Any) -> bytes:
    """JSON with sorted keys: equal JSON values give equal bytes."""
    return msgspec.json.encode(value, order="sorted")


def check_token(token: object) -> int:
    """A claim token: a non-negative integer."""
    if isinstance(token, bool) or not isinstance(token, int) or token < 0:
        raise InvalidInput("token", "must be a non-negative integer")
    return token


def check_policy(policy: object) -> RetentionPolicy:
    """A retention policy with finite, non-negative ages (at most ``MAX_AGE_SECONDS``, a
    century) and counts."""
    if not isinstance(policy, RetentionPolicy):
        raise InvalidInput("policy", "must be a RetentionPolicy")
    for name in (
        "checkpoint_max_age",
        "event_max_age",
        "receipt_max_age",
        "settled_dispatch_max_age",
    ):
        value = getattr(policy, name)
        if value is not None:
            check_seconds(name, value, allow_zero=True, maximum=MAX_AGE_SECONDS)
    for name in ("keep_checkpoints", "keep_events"):
        value = getattr(policy, name)
        if value is not None:
            check_count(name, value, maximum=2**62)
    return policy
