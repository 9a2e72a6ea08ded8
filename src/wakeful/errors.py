"""One error hierarchy, rooted at ``WakefulError``.

Backends translate their driver errors into these at their boundary. Every error carries
structured fields, a message that says what happened and what the caller can do, and
``retryable``: whether the same call may succeed later without changing anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wakeful.records import Receipt


class WakefulError(Exception):
    """Base of every error wakeful raises on purpose."""

    retryable: bool = False


class OutcomeUnknown(WakefulError):
    """An operation may or may not have taken effect and nobody can tell which now (it was
    sent and its answer was lost, or the process running it died mid-call). It is neither a
    failure nor a success: reporting it as failed invites a retry under a new identity, a
    second effect. An agent tool that raises it is recorded ``indeterminate``."""


class InvalidInput(WakefulError, ValueError):
    """An argument is malformed (an id outside its alphabet, a negative ttl, a payload too
    large). Nothing was read or written."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"invalid {field}: {problem}")


class ThreadBusy(WakefulError):
    """Another live claim holds the thread. Nothing changed; retry once it is released or
    has expired."""

    retryable = True

    def __init__(
        self,
        thread_id: str,
        holder: str | None,
        checkpoint_id: str | None,
        expires_at: Any = None,
        *,
        run_id: str | None = None,
        dispatch_id: str | None = None,
    ) -> None:
        self.thread_id = thread_id
        self.holder = holder
        self.checkpoint_id = checkpoint_id
        self.expires_at = expires_at
        self.run_id = run_id
        """The busy run (a submission refused with ``if_busy="reject"``), when known."""
        self.dispatch_id = dispatch_id
        """The dispatch holding the thread's run slot (``if_busy="reject"``)."""
        if dispatch_id is not None:
            run = f"run {run_id!r} (dispatch {dispatch_id!r})" if run_id else repr(dispatch_id)
            super().__init__(
                f"thread {thread_id!r} is busy with {run}; nothing was stored: submit again "
                f"once it finishes, or with if_busy='enqueue' to wait for it"
            )
            return
        who = f"holder {holder!r}" if holder is not None else "another claimant"
        at = f" (latest checkpoint {checkpoint_id!r})" if checkpoint_id else ""
        super().__init__(
            f"thread {thread_id!r} is held by {who}{at}; retry after it releases the thread "
            f"or its claim expires"
        )


class StaleClaim(WakefulError):
    """The token is not the thread's current claim: it was taken over, released, cancelled
    or deleted, or was never issued. Nothing was written; the caller must stop acting for
    the thread.

    ``applied_receipt``: for a commit whose ``operation_id`` the thread has recorded with the
    same payload, that operation's original receipt: an earlier attempt of this very commit
    was applied before the claim was lost (a retry after ``StoreUnavailable``), so the
    caller learns its outcome without another read. ``None`` otherwise."""

    def __init__(
        self,
        thread_id: str,
        token: int | None,
        current: int | None,
        applied_receipt: Receipt | None = None,
    ) -> None:
        self.thread_id = thread_id
        self.token = token
        self.current = current
        self.applied_receipt = applied_receipt
        now = f"the current token is {current}" if current is not None else "no claim is current"
        applied = ""
        if applied_receipt is not None:
            applied = (
                f"; operation {applied_receipt.operation_id!r}: this operation was applied "
                f"before the claim was lost (thread version {applied_receipt.version})"
            )
        super().__init__(
            f"claim token {token} on thread {thread_id!r} is stale ({now}){applied}; this "
            f"holder no longer owns the thread and must stop writing to it"
        )


class VersionConflict(WakefulError):
    """The commit was prepared against an older view of the thread (``expected_version`` or
    the checkpoint's ``parent`` is not current). Nothing was applied; re-read and decide."""

    def __init__(
        self,
        thread_id: str,
        expected: int | str | None,
        actual: int | str | None,
        what: str = "version",
    ) -> None:
        self.thread_id = thread_id
        self.expected = expected
        self.actual = actual
        self.what = what
        super().__init__(
            f"thread {thread_id!r}: expected {what} {expected!r} but the latest is {actual!r}; "
            f"nothing was applied, re-read the thread before committing again"
        )


class OperationConflict(WakefulError):
    """An operation id was reused with a different payload. Fails closed: nothing applied."""

    def __init__(self, thread_id: str, operation_id: str) -> None:
        self.thread_id = thread_id
        self.operation_id = operation_id
        super().__init__(
            f"operation {operation_id!r} on thread {thread_id!r} was already committed with a "
            f"different payload; nothing was applied (operation ids must name one payload)"
        )


class InvalidCommit(WakefulError):
    """The commit is inconsistent with the thread (writes naming another checkpoint, a
    duplicate message id, consuming an unknown inbox entry). Nothing was applied."""

    def __init__(self, thread_id: str, problem: str) -> None:
        self.thread_id = thread_id
        self.problem = problem
        super().__init__(f"commit to thread {thread_id!r} refused: {problem}; nothing was applied")


class ReplayUnavailable(WakefulError):
    """Events before ``earliest_seq`` were compacted away. Read from ``earliest_seq - 1``
    (the state at the latest checkpoint already includes their effect)."""

    def __init__(self, thread_id: str, after_seq: int, earliest_seq: int) -> None:
        self.thread_id = thread_id
        self.after_seq = after_seq
        self.earliest_seq = earliest_seq
        super().__init__(
            f"thread {thread_id!r}: events after {after_seq} are no longer available, the "
            f"earliest kept event is {earliest_seq}; resume reading from {earliest_seq - 1}"
        )


class TenantMismatch(WakefulError):
    """The thread belongs to another tenant. The message names no other tenant's data."""

    def __init__(self, thread_id: str) -> None:
        self.thread_id = thread_id
        super().__init__(f"thread {thread_id!r} does not belong to this tenant")


class NotFound(WakefulError):
    """The named object does not exist."""

    def __init__(self, what: str, ident: str) -> None:
        self.what = what
        self.ident = ident
        super().__init__(f"{what} {ident!r} does not exist")


class ScheduleContended(WakefulError):
    """A change to a schedule lost its compare-and-set every time it was tried (the schedule
    kept changing under it: firers advancing it, other operators). Nothing changed; retry."""

    retryable = True

    def __init__(self, name: str, tries: int) -> None:
        self.name = name
        super().__init__(
            f"schedule {name!r} changed {tries} times while this change was being made; retry"
        )


class InvalidState(WakefulError):
    """The object exists but is not in a state that allows the operation. Nothing changed."""

    def __init__(self, what: str, ident: str, state: str, problem: str) -> None:
        self.what = what
        self.ident = ident
        self.state = state
        self.problem = problem
        super().__init__(f"{what} {ident!r} is {state}: {problem}; nothing changed")


class DispatchConflict(WakefulError):
    """A dispatch id or dedupe key is already taken by a dispatch with a different payload.
    Fails closed: nothing enqueued."""

    def __init__(self, dispatch_id: str, existing_id: str, key: str) -> None:
        self.dispatch_id = dispatch_id
        self.existing_id = existing_id
        self.key = key
        super().__init__(
            f"dispatch {dispatch_id!r} conflicts with existing dispatch {existing_id!r} "
            f"(same {key}, different payload); nothing was enqueued"
        )


class WorkerSuperseded(WakefulError):
    """A newer registration of the same ``worker_id`` exists; this incarnation must stop."""

    def __init__(self, worker_id: str, generation: int, current: int) -> None:
        self.worker_id = worker_id
        self.generation = generation
        self.current = current
        super().__init__(
            f"worker {worker_id!r} generation {generation} was superseded by generation "
            f"{current}; this process must stop claiming work"
        )


class StreamCheckpointError(WakefulError):
    """A stream checkpoint could not be read, written or deleted (``reason`` is ``"stale"``
    for a fenced put, ``"storage"`` for a storage failure). Callers log it and go on."""

    def __init__(self, run_id: str, reason: str, detail: str) -> None:
        self.run_id = run_id
        self.reason = reason
        self.detail = detail
        super().__init__(f"stream checkpoint of run {run_id!r}: {detail}")


class StoreUnavailable(WakefulError):
    """The storage could not be reached or did not answer. The operation may or may not
    have been applied if it was a commit: retry it with the same operation id."""

    retryable = True

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(f"store unavailable: {detail}; retry later")


class StoreRefused(WakefulError):
    """The storage was reached but refused the connection: the database does not exist, the
    login or password was refused, or the server does not allow this client. Retrying the
    same URL will not help; fix the URL or the server's configuration."""

    def __init__(self, where: str, detail: str) -> None:
        self.where = where
        self.detail = detail
        super().__init__(
            f"{where} refused the connection: {detail}; check the store URL (database, user, "
            f"password) and the server's access rules, retrying will not help"
        )


class StoreClosed(WakefulError):
    """The store was closed; open it again."""

    def __init__(self) -> None:
        super().__init__("the store is closed; open it again with open_store()")


class CorruptStore(WakefulError):
    """Stored data failed validation. The store refused to open and changed nothing. Stop
    the writers, preserve the files, and restore or investigate the named record."""

    def __init__(self, path: str, offset: int | None, line: int | None, detail: str) -> None:
        self.path = path
        self.offset = offset
        self.line = line
        self.detail = detail
        where = f" at byte {offset}, line {line}" if offset is not None else ""
        super().__init__(
            f"corrupt store {path}{where}: {detail}; the files were left unchanged: preserve "
            f"them and restore a known-good copy or inspect that record before reopening"
        )


class StoreLocked(WakefulError):
    """Another opener (this process or another) holds the store's exclusive lock."""

    def __init__(self, root: str) -> None:
        self.root = root
        super().__init__(
            f"store {root} is already open in another process or handle; close that one "
            f"first (one process owns a file store)"
        )


class UnsupportedStore(WakefulError, ValueError):
    """The URL names a scheme no backend handles, or a backend whose extra is missing."""

    def __init__(self, url: str, detail: str) -> None:
        self.url = url
        self.detail = detail
        super().__init__(f"cannot open store {url!r}: {detail}")


# --------------------------------------------------------------------------- runtime


class GraphInvalid(WakefulError, ValueError):
    """The graph definition is inconsistent (unknown node, unreachable node, no entry)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid graph: " + "; ".join(problems))


class GraphChanged(WakefulError):
    """The thread's run was made by a graph with another structure. Recovering it with this
    graph could misread its frontier; pass ``allow_graph_change=True`` if that is intended."""

    def __init__(self, thread_id: str, recorded: str | None, current: str) -> None:
        self.thread_id = thread_id
        self.recorded = recorded
        self.current = current
        super().__init__(
            f"thread {thread_id!r} was run by graph {recorded!r} but this graph is {current!r}; "
            f"pass allow_graph_change=True to continue it anyway"
        )


class RunInProgress(WakefulError):
    """``start`` was called on a thread whose last run is unfinished (running or suspended).
    Recover, resume or cancel it first."""

    def __init__(self, thread_id: str, run_id: str, status: str) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.status = status
        super().__init__(
            f"thread {thread_id!r} has an unfinished run {run_id!r} ({status}); recover, "
            f"resume or cancel it before starting another"
        )


class NothingToRecover(WakefulError):
    """``recover`` found no running run on the thread."""

    def __init__(self, thread_id: str, status: str | None) -> None:
        self.thread_id = thread_id
        self.status = status
        what = f"its last run is {status}" if status else "it has no run"
        super().__init__(f"nothing to recover on thread {thread_id!r}: {what}")


class NotSuspended(WakefulError):
    """``resume`` was called on a thread whose run is not waiting for answers."""

    def __init__(self, thread_id: str, status: str | None) -> None:
        self.thread_id = thread_id
        self.status = status
        super().__init__(
            f"thread {thread_id!r} is not suspended (status {status!r}); nothing to resume"
        )


class UnknownTicket(WakefulError, ValueError):
    """``resume`` answered a ticket the suspended run does not have open."""

    def __init__(self, thread_id: str, tickets: list[str]) -> None:
        self.thread_id = thread_id
        self.tickets = tickets
        super().__init__(f"thread {thread_id!r} has no open tickets {tickets!r}")


class CheckpointWriteFailed(WakefulError):
    """The run could not record its progress (``cause``: usually ``StaleClaim``, when another
    process took the thread over). The run stopped; nothing it did afterwards was recorded.

    ``applied_receipt``: the cause's ``StaleClaim.applied_receipt``: the run's last commit
    was applied (by an attempt whose answer was lost) before the claim was; else ``None``."""

    def __init__(self, thread_id: str, run_id: str, cause: BaseException) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.cause = cause
        # getattr: a StaleClaim rebuilt from a problem document has only some fields
        self.applied_receipt: Receipt | None = getattr(cause, "applied_receipt", None)
        super().__init__(
            f"run {run_id!r} on thread {thread_id!r} stopped: its progress could not be "
            f"recorded ({type(cause).__name__}: {cause})"
        )


class RunStalled(WakefulError):
    """The run made no progress and was not known to be waiting for ``idle`` seconds (more
    than ``ClaimPolicy.stall_after``): its claim is no longer renewed, so once it expires
    another worker takes the run over from its last commit. This process's run stops and
    records nothing more (it ends with ``CheckpointWriteFailed`` carrying this cause)."""

    retryable = True

    def __init__(self, thread_id: str, run_id: str, idle: float) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.idle = idle
        super().__init__(
            f"run {run_id!r} on thread {thread_id!r} made no progress for {idle:g} s and was "
            f"not waiting on a model, a tool or a sleep; its claim is no longer renewed and "
            f"another worker takes it over when it expires (raise ClaimPolicy.stall_after, or "
            f"wrap a long wait in ctx.waiting(), if the run was only slow)"
        )


class RunFailed(WakefulError):
    """A node failed after its retries, or the run hit its step limit. The thread records the
    run as ``failed`` with this error."""

    def __init__(self, thread_id: str, run_id: str, error: str) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.error = error
        super().__init__(f"run {run_id!r} on thread {thread_id!r} failed: {error}")


class RunCancelled(WakefulError):
    """The run was cancelled; the thread records it as ``cancelled``."""

    def __init__(self, thread_id: str, run_id: str) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        super().__init__(f"run {run_id!r} on thread {thread_id!r} was cancelled")


class ChildFailed(WakefulError):
    """A child run (``NodeContext.spawn``) that a ``join`` waited for did not complete: it
    failed, was cancelled or interrupted, or was recorded indeterminate. ``status`` is how it
    ended and ``error`` what its thread recorded; handle it in the parent (a failed child
    never fails its parent on its own)."""

    def __init__(self, thread_id: str, run_id: str, status: str, error: str | None) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.status = status
        self.error = error
        reason = f": {error}" if error else ""
        super().__init__(f"child run {run_id!r} on thread {thread_id!r} ended {status}{reason}")


class RunYielded(WakefulError):
    """The run stopped at a superstep boundary because its process is shutting down. Its
    committed progress stays; another process recovers it."""

    retryable = True

    def __init__(self, thread_id: str, run_id: str) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        super().__init__(
            f"run {run_id!r} on thread {thread_id!r} stopped at a checkpoint to let its "
            f"process shut down; it will be recovered"
        )


class RunInterrupted(WakefulError):
    """A task failed with a transient error (``cause.retryable``, e.g. a model provider that
    stayed overloaded through its retries). The run stopped at its last checkpoint without
    recording an ending; recover it later (a worker retries it with backoff)."""

    retryable = True

    def __init__(self, thread_id: str, run_id: str, cause: str) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.cause = cause
        super().__init__(
            f"run {run_id!r} on thread {thread_id!r} stopped after a transient failure "
            f"({cause}); its progress is kept, recover it later"
        )


class RequestRefused(WakefulError):
    """The HTTP API answered a request with a problem document that no other error class
    stands for: 400 (undecodable body), 401 (missing or unknown token), 403 (an operator route
    with a tenant token), 413 (body too large), 500 (the server failed; ``problem`` carries its
    ``error_id``). ``status`` and ``problem`` are the answer; fix the request or the
    credentials, or report the ``error_id``."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        detail = problem.get("detail") or problem.get("title") or "request refused"
        super().__init__(f"HTTP {status}: {detail}")
