"""Pydantic models of the HTTP API. They exist only at the HTTP boundary: routes convert the
store's records (``wakeful.records``) into these views, and request bodies are validated
here before anything reaches the store. Request models reject unknown fields."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from wakeful.errors import InvalidInput
from wakeful.fleet.webhook_signing import check_webhook_url

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@+=-]*$"
"""The identifier alphabet of ``wakeful.ids`` (letters, digits, ``. _ - : @ + =``; the first
character a letter or a digit)."""

MAX_ID = 200
MAX_KEY = 190
"""Idempotency keys and message ids: short enough that the run id derived from them
(``run-<dispatch id>``, ``run-ext-<message id>``) is still a valid identifier."""

MAX_PRIORITY = 1000
"""Priorities of submitted work are within +-1000; the store reserves higher values (a
cancel jumps the queue at 2**31-1)."""

AT_PATTERN = r"^(19|20)[0-9]{2}-"
"""``at`` over HTTP: an instant of the years 1900-2099 (each far inside what every store and
a UTC conversion can hold)."""
MAX_DELAY_SECONDS = 100 * 366 * 86400.0
"""The farthest ahead a run may be delayed (``wakeful.fleet.delays.MAX_DELAY``)."""

_PORT = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
WEBHOOK_PATTERN = rf"^https?://[A-Za-z0-9._-]+(:{_PORT})?([/?][^\x00-\x20\x7f#@]*)?$"
"""A webhook URL over HTTP (``wakeful.fleet.webhook_signing.check_webhook_url`` decides; this
is the part a JSON Schema can say): http(s), a host name or IPv4 address, no credentials, no
fragment."""
Id = Annotated[str, StringConstraints(pattern=ID_PATTERN, min_length=1, max_length=MAX_ID)]
Key = Annotated[str, StringConstraints(pattern=ID_PATTERN, min_length=1, max_length=MAX_KEY)]

RunStatus = Literal[
    "running", "suspended", "completed", "failed", "cancelled", "indeterminate", "interrupted"
]
DispatchStatus = Literal[
    "scheduled", "queued", "waiting_key", "pending", "leased", "awaiting", "done", "quarantined"
]
IfBusy = Literal["enqueue", "reject", "interrupt", "rollback", "coalesce"]
SubmittedIfBusy = IfBusy
"""What a request may ask for: every policy (the name stays for callers that used it)."""
DispatchKind = Literal["start", "resume", "cancel", "message"]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _View(BaseModel):
    model_config = ConfigDict(from_attributes=True)


# --------------------------------------------------------------------------- requests
_EXCLUSIVE = (("after", "at"), ("debounce", "after"), ("debounce", "at"))  # one of each pair


class SubmitRun(_Request):
    """Start a run of a registered agent or graph on the thread."""

    target: Id = Field(description="The registered agent or graph to run.")
    input: Any = Field(default=None, description="The run's input (any JSON value).")
    priority: int = Field(
        default=0, ge=-MAX_PRIORITY, le=MAX_PRIORITY, description="Higher runs first."
    )
    max_attempts: int = Field(
        default=5, ge=1, le=100, description="Claims before the work counts as exhausted."
    )
    # after and at are never null (absent instead) and never both: the JSON Schema says so,
    # so a request that validates against it is accepted
    after: Annotated[float, Field(ge=0, le=MAX_DELAY_SECONDS)] | SkipJsonSchema[None] = Field(
        default=None,
        description="Delay the run by this many seconds, by the store's clock (not with at).",
    )
    at: AwareDatetime | SkipJsonSchema[None] = Field(
        default=None,
        description="Run it at this instant, with its offset, in the years 1900-2099 (not "
        "with after); an instant in the past runs at once.",
        json_schema_extra={"pattern": AT_PATTERN},
    )
    from_checkpoint: Id | None = Field(
        default=None,
        description="Replay from this checkpoint of the thread (time travel): the run starts "
        "from its state, messages and frontier (with ``input``: from START on its state); "
        "from an earlier checkpoint the thread branches.",
    )
    if_busy: SubmittedIfBusy = Field(
        default="enqueue",
        description="When the thread is busy (a run is unfinished: running, queued or "
        "suspended): 'enqueue' waits (202, status 'queued', queued_behind), 'reject' refuses "
        "(409 thread-busy naming run_id, nothing stored), 'interrupt' stops the busy run (it "
        "ends 'interrupted') and runs next, 'rollback' stops it and returns the thread to "
        "where it was before that run started (event run.rolled_back lists its tool calls "
        "that took effect) and runs next, 'coalesce' merges with the other coalesce "
        "submissions waiting with it into one run.",
    )
    webhook: str | SkipJsonSchema[None] = Field(
        default=None,
        description="POST a signed JSON body (Standard Webhooks) to this http(s) URL when the "
        "run ends or suspends on a question; no credentials in it (user:password@).",
        json_schema_extra={"pattern": WEBHOOK_PATTERN, "maxLength": 2048},
    )
    debounce: Annotated[float, Field(gt=0, le=MAX_DELAY_SECONDS)] | SkipJsonSchema[None] = Field(
        default=None,
        description="Debounce window in seconds (not with after or at): a burst of "
        "submissions of the target to the thread within it starts one run, with the last "
        "input, this long after the last one. While that run has not started, a "
        "submission replaces its input and returns its dispatch_id and run_id (202, "
        "status 'scheduled', not_before). Absent: the target's registered debounce, if "
        "any.",
    )
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"allOf": [{"not": {"required": list(p)}} for p in _EXCLUSIVE]},
    )

    @field_validator("after", "at", "webhook", "debounce", mode="before")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("leave it out rather than null")
        return value

    @field_validator("webhook")
    @classmethod
    def _webhook(cls, value: str | None) -> str | None:
        """One message that never repeats the URL (it may hold a secret)."""
        if value is None:
            return None
        try:
            check_webhook_url(value)
        except InvalidInput as exc:
            raise ValueError(exc.problem) from None
        if re.fullmatch(WEBHOOK_PATTERN, value) is None:
            raise ValueError("must be http(s)://host[:port][/path][?query], a host name or IPv4")
        return value

    @model_validator(mode="after")
    def _one_delay(self) -> SubmitRun:
        if self.after is not None and self.at is not None:
            raise ValueError("give after or at, not both")
        if self.debounce is not None and (self.after is not None or self.at is not None):
            raise ValueError("give debounce, or after or at, not both")
        if self.at is not None and not 1900 <= self.at.year <= 2099:
            raise ValueError("at must be in the years 1900-2099")
        return self


class ResumeRun(_Request):
    """Answer open tickets of the thread's suspended run."""

    answers: dict[Id, Any] = Field(
        description="Answers by ticket id.",
        # pydantic puts the key pattern in patternProperties, which lets other keys through
        json_schema_extra={
            "propertyNames": {"pattern": ID_PATTERN, "minLength": 1, "maxLength": MAX_ID},
            "additionalProperties": False,
        },
    )


class CancelRun(_Request):
    """Cancel the thread's work."""

    reason: str = Field(default="cancelled", max_length=1000)


class SendMessage(_Request):
    """Deliver a message from outside to the thread: it starts a run of the thread's graph
    (or ``target``) with the message as input, once per ``message_id``."""

    payload: Any = Field(description="The message (any JSON value).")
    message_id: Key | None = Field(
        default=None,
        description="Deduplicates the delivery; defaults to the Idempotency-Key header, else "
        "a fresh id.",
    )
    target: Id | None = Field(default=None, description="The agent or graph to run it with.")
    correlation_id: Id | None = None
    if_busy: SubmittedIfBusy = Field(
        default="enqueue",
        description="When the thread is busy (a run is unfinished: running, queued or "
        "suspended): 'enqueue' waits (202, status 'queued', queued_behind), 'reject' refuses "
        "(409 thread-busy naming run_id, nothing stored), 'interrupt' stops the busy run (it "
        "ends 'interrupted') and runs next, 'rollback' stops it and returns the thread to "
        "where it was before that run started (event run.rolled_back lists its tool calls "
        "that took effect) and runs next, 'coalesce' merges with the other coalesce "
        "submissions waiting with it into one run.",
    )


class UpdateState(_Request):
    """Commit a new checkpoint whose state is ``values`` applied through the graph's
    reducers (``Runtime.update_state``)."""

    values: dict[str, Any] = Field(description="State fields, as a node would return them.")
    as_node: Id | None = Field(
        default=None,
        description="As if this node had returned ``values``: the next step routes from it.",
    )
    checkpoint_id: Id | None = Field(
        default=None,
        description="The checkpoint to edit (default: the head); an earlier one branches.",
    )


class ForkThread(_Request):
    """Copy the thread as of a checkpoint into a new thread (``wakeful.fork``)."""

    new_thread_id: Id = Field(description="The new thread's id (it must have no history).")
    checkpoint_id: Id | None = Field(
        default=None, description="The checkpoint to copy (default: the head)."
    )


class EditMessage(_Request):
    """Run the thread's agent on from an edited user message (``fleet.edit_message``)."""

    content: str = Field(max_length=100_000, description="The new text of the message.")
    target: Id | None = Field(default=None, description="The agent to run (default: the thread's).")


class Regenerate(_Request):
    """Answer the thread's last user message again (``fleet.regenerate``)."""

    target: Id | None = Field(default=None, description="The agent to run (default: the thread's).")


# --------------------------------------------------------------------------- views


class Accepted(BaseModel):
    """Work persisted as a dispatch; a worker will act on it."""

    dispatch_id: str
    thread_id: str
    kind: DispatchKind
    status: DispatchStatus = Field(description="The dispatch's delivery status.")
    run_id: str | None = Field(description="The run the work belongs to, when known.")
    message_id: str | None = None
    not_before: datetime | None = Field(
        default=None, description="When the work becomes claimable (the store's clock)."
    )
    queued_behind: str | None = Field(
        None,
        description="Status 'queued': the thread is busy (a run is unfinished: running, "
        "queued or suspended on a ticket) and this work waits behind that dispatch.",
    )


class ClaimView(_View):
    holder: str
    token: int = Field(description="The fencing token of the claim.")
    expires_at: datetime


class ThreadView(BaseModel):
    """One thread. ``version`` 0 and ``status`` null: work was submitted but no run has
    recorded anything yet."""

    thread_id: str
    tenant: str | None
    version: int
    status: RunStatus | Literal["sleeping"] | None = Field(
        description="The latest run's status; ``sleeping``: suspended in ``ctx.sleep`` until "
        "``wake_at``."
    )
    wake_at: datetime | None = Field(
        default=None, description="When the sleeping run wakes (the store's clock)."
    )
    run_id: str | None
    checkpoint_id: str | None
    graph: str | None
    updated_at: datetime | None = Field(description="When the latest checkpoint was made.")
    claim: ClaimView | None = Field(description="The current claim; it may have expired.")
    state: Any = Field(description="The latest checkpoint's state.")
    message_count: int
    last_seq: int = Field(description="The latest event number (0: none yet).")
    event_floor: int = Field(description="The earliest event number still readable.")
    tickets: list[dict[str, Any]] = Field(
        description="Open tickets of a suspended run (id, task_id, node, question, schema)."
    )
    parent: dict[str, Any] | None = Field(
        default=None,
        description="For a child run (``ctx.spawn``): the run that spawned it "
        "(``thread``, ``run_id``).",
    )


class ThreadSummaryView(_View):
    thread_id: str
    tenant: str | None
    version: int
    checkpoint_id: str | None
    status: RunStatus | None
    message_count: int
    last_seq: int
    updated_at: datetime


class ThreadPage(BaseModel):
    threads: list[ThreadSummaryView]
    next_after: str | None = Field(description="Cursor of the next page; null at the end.")


class MessageView(_View):
    id: str
    role: Literal["system", "user", "assistant", "tool"]
    content: Any = None
    tool_calls: list[Any] = Field(default_factory=list)
    tool_call_id: str | None = None
    run_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class MessagePage(BaseModel):
    messages: list[MessageView]
    next_after: int = Field(description="Pass as ``after`` for the next page (a count).")


class EventView(_View):
    thread_id: str
    seq: int
    at: datetime
    type: str
    data: Any = None
    run_id: str | None = None
    checkpoint_id: str | None = None
    task_id: str | None = None


class EventPage(BaseModel):
    events: list[EventView]
    next_after: int = Field(description="Pass as ``after`` for the next page (a seq).")


class RunView(BaseModel):
    """A run, derived from the thread's checkpoint history (or its queued dispatch)."""

    run_id: str
    status: str = Field(
        description="The run's latest status, ``queued`` before it starts, or ``sleeping`` "
        "while it is suspended in ``ctx.sleep`` (see ``wake_at``)."
    )
    wake_at: datetime | None = Field(
        default=None, description="When the sleeping run wakes (the store's clock)."
    )
    graph: str | None
    checkpoint_id: str | None = Field(description="The run's latest checkpoint.")
    started_at: datetime | None = Field(description="Its oldest checkpoint still kept.")
    updated_at: datetime | None
    checkpoints: int = Field(description="How many of its checkpoints are kept.")
    dispatch_id: str | None = None


class RunPage(BaseModel):
    runs: list[RunView]
    next_before: str | None = Field(
        description="Pass as ``before`` for older runs; null at the end."
    )


class CheckpointView(BaseModel):
    """One checkpoint of a thread's history."""

    id: str
    parent: str | None
    run_id: str
    status: RunStatus
    created_at: datetime
    committed_at: datetime = Field(description="When the store committed it.")
    state: Any = Field(default=None, description="The state it recorded (unless `state=false`).")
    frontier: list[Any] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)


class CheckpointPage(BaseModel):
    checkpoints: list[CheckpointView]
    next_before: str | None = Field(
        description="Pass as ``before`` for older checkpoints; null at the end."
    )


class HistoryEntryView(_View):
    """One checkpoint of the history (``wakeful.HistoryEntry``)."""

    checkpoint_id: str
    parent: str | None
    run_id: str
    status: RunStatus
    step: int | None = Field(description="The superstep it ended.")
    nodes: list[str] = Field(description="The nodes whose tasks produced it.")
    source: str | None = Field(
        description="How it came to be: input, loop, replay, update or fork."
    )
    branch: int = Field(description="The branch it was committed on (0: the original line).")
    current: bool = Field(description="On the head's line (false: an abandoned branch).")
    head: bool = Field(description="The thread's latest checkpoint.")
    created_at: datetime = Field(description="When it was committed.")
    messages: int | None = Field(description="The message count as of it (null: unknown).")
    subgraphs: dict[str, Any] = Field(
        default_factory=dict,
        description="What ran inside the subgraph nodes that produced it, by node path: "
        "the subgraph's name and the nodes of each of its supersteps.",
    )


class BranchView(_View):
    """Where a branch came from (``wakeful.records.Branch``)."""

    number: int
    parent: int = Field(description="The branch its fork point is on.")
    fork_point: str = Field(description="The checkpoint it continues from.")
    old_head: str | None = Field(description="The head it left (the abandoned line's end).")
    checkpoint_id: str = Field(description="Its first checkpoint.")
    messages: int = Field(description="How many messages of the parent's view it kept.")
    at: datetime


class HistoryPage(BaseModel):
    entries: list[HistoryEntryView] = Field(description="Checkpoints, newest first.")
    branches: list[BranchView] = Field(
        description="The thread's branches, branch 1 first (the last is the head's)."
    )
    next_before: str | None = Field(
        description="Pass as ``before`` for older checkpoints; null at the end."
    )


class CheckpointDetail(BaseModel):
    """One checkpoint in full, with the messages as of it."""

    entry: HistoryEntryView
    state: Any = None
    frontier: list[Any] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    messages: list[MessageView] = Field(description="The messages as of it (a page).")
    next_after: int | None = Field(
        description="Pass as ``after`` for more messages; null when all were read (or the "
        "count as of it is unknown)."
    )


class TargetView(_View):
    name: str
    kind: Literal["agent", "graph"] = Field(
        description="An agent takes text (the user message); a graph a JSON object."
    )
    input_schema: dict[str, Any] = Field(description="A JSON Schema of the input it takes.")
    default: bool = Field(description="Whether messages to a thread without a run go to it.")


class TargetPage(_View):
    targets: list[TargetView]
    registry: bool = Field(
        description="Whether the server knows its targets (`wakeful serve --app`); without a "
        "registry it takes any name and the worker decides."
    )


class Identity(BaseModel):
    """Who a bearer token is."""

    tenant: str | None = Field(description="The tenant (null for operators).")
    operator: bool = Field(description="Whether the operator routes are open to it.")
    development: bool = Field(description="The server has no tokens: everyone is an operator.")


class DispatchView(_View):
    dispatch_id: str
    thread_id: str
    kind: DispatchKind
    payload: Any = None
    priority: int
    available_at: datetime | None
    not_before: datetime | None = Field(
        default=None,
        description="When pending work waiting for a time becomes claimable (its "
        "available_at: a delayed run, a retry's backoff, a sleeping run's wake-up); null "
        "for work claimable since it was stored, and once leased or settled.",
    )
    max_attempts: int
    dedupe_key: str | None
    status: DispatchStatus
    attempts: int
    exhausted: bool
    token: int | None
    holder: str | None
    lease_until: datetime | None
    last_error: str | None
    created_at: datetime | None
    updated_at: datetime | None
    if_busy: IfBusy = Field("enqueue", description="What the submission does on a busy thread.")
    queued_behind: str | None = Field(
        None, description="The dispatch it waited behind when enqueued 'queued'."
    )
    coalesced: list[str] = Field(
        default_factory=list, description="The coalesced submissions its run answers too."
    )
    answered_by: str | None = Field(
        None, description="The dispatch whose run answered this coalesced submission."
    )
    concurrency_key: str | None = Field(
        None, description="Its concurrency key: at most concurrency_limit of the key run at once."
    )
    concurrency_limit: int | None = Field(None, description="The key's limit it was sent with.")


class DispatchPage(BaseModel):
    dispatches: list[DispatchView]
    next_after: str | None = Field(description="Cursor of the next page; null at the end.")


class Inspection(BaseModel):
    """A quarantined dispatch and the thread it would act on."""

    dispatch: DispatchView
    thread: ThreadView | None


class WorkerView(_View):
    worker_id: str
    incarnation_id: str
    generation: int
    registered_at: datetime
    last_heartbeat: datetime
    stopped_at: datetime | None = Field(
        default=None,
        description="When this incarnation recorded its graceful stop; null while it runs "
        "or if it died without stopping (then its heartbeat ages: expired).",
    )
    version: str | None = Field(
        default=None,
        description="The code version this incarnation runs (docs/deploys.md); null for a "
        "worker that named none.",
    )


class WorkerList(BaseModel):
    workers: list[WorkerView]


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(Health):
    """``/readyz``: the store answered. ``server``, for a PostgreSQL store: its role
    (``primary``/``standby``), replication (``none``, ``synchronous``, ``asynchronous``,
    ``waiting``, ``unknown``, ``standby``), standbys, pooler mode, clock skew and warnings
    (``wakeful.store.postgres.serverinfo.ServerReport``)."""

    server: dict[str, Any] | None = None


class Problem(BaseModel):
    """An RFC 7807 problem document (``application/problem+json``). Domain fields
    (``thread_id``, ``dispatch_id``, ``field``, ``earliest_seq``, ``errors`` ...) appear where
    they apply."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="A URI naming the kind of problem (urn:wakeful:problem:*).")
    title: str
    status: int
    detail: str
    instance: str | None = Field(default=None, description="The request path.")


SSE_EVENT: dict[str, object] = {
    "type": "object",
    "description": "One Server-Sent Event, as a client parses it from the stream (the event "
    "stream schema of the OpenAPI specification): `data` is a JSON document.",
    "required": ["data"],
    "properties": {
        "data": {"type": "string"},
        "event": {"type": "string"},
        "id": {"type": "string"},
        "retry": {"type": "integer", "minimum": 0},
    },
}
"""The schema of each event of an SSE response (schemathesis validates every event by it)."""
