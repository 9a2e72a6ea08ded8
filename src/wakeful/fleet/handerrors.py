"""The Remote Hand's errors (``wakeful.fleet.hand`` re-exports them): what a call to a hand
can end in besides its result. ``HandUnavailable``, ``HandConflict``, ``UnknownTool`` and
``HandRejected`` say the call did not run; ``HandError`` says it ran and failed; the two
``HandIndeterminate`` kinds say nobody knows (never report those as failures)."""

from __future__ import annotations

from wakeful.errors import OutcomeUnknown, WakefulError


class HandIndeterminate(OutcomeUnknown):
    """The hand recorded the call's start but no result: the process running it died
    mid-call. The tool was not run again and its effect is unknown. An agent tool that
    raises it (or returns ``INDETERMINATE``) is recorded ``indeterminate``."""

    def __init__(self, operation_id: str, tool: str, message: str | None = None) -> None:
        self.operation_id = operation_id
        self.tool = tool
        super().__init__(
            message
            or f"operation {operation_id!r} ({tool}) started on the hand but never finished: "
            f"its outcome is unknown and it was not run again"
        )


class HandOutcomeUnknown(HandIndeterminate):
    """The call may have reached the hand (it was sent, then the connection dropped, the
    answer timed out or a 5xx came back) and the hand gave no answer about it within
    ``RemoteHand.recovery_window``. Its effect is unknown; the same operation id asked
    later (``RemoteHand.lookup``) may tell. A subclass of ``HandIndeterminate``: an agent
    records the call ``indeterminate``, never as an error."""

    retryable = True

    def __init__(self, operation_id: str, tool: str, window: float, detail: str) -> None:
        self.window = window
        self.detail = detail
        super().__init__(
            operation_id,
            tool,
            f"operation {operation_id!r} ({tool}) may have reached the hand ({detail}) and "
            f"the hand did not say what became of it within {window:g} s: its outcome is "
            f"unknown; look it up later with the same operation id, never call it again "
            f"under a new one",
        )


class HandError(WakefulError):
    """The tool ran and raised; ``error`` is the recorded ``Type: message``. A retry with
    the same operation id returns the same error (it is not run again)."""

    def __init__(self, operation_id: str, tool: str, error: str) -> None:
        self.operation_id = operation_id
        self.tool = tool
        self.error = error
        super().__init__(f"operation {operation_id!r} ({tool}) failed on the hand: {error}")


class HandUnavailable(WakefulError):
    """The hand could not be reached on any attempt (connection refused, DNS failure,
    connect timeout, HTTP 429): the call provably never reached it, so nothing ran. Retry
    later with the same operation id. (A call that may have reached the hand is never
    reported this way: see ``HandOutcomeUnknown``. ``RemoteHand.lookup``, which is
    read-only, raises it after any failure on every attempt.)"""

    retryable = True

    def __init__(self, operation_id: str, attempts: int, detail: str) -> None:
        self.operation_id = operation_id
        self.attempts = attempts
        self.detail = detail
        super().__init__(
            f"hand unavailable for operation {operation_id!r} after {attempts} attempts "
            f"({detail}); retry later with the same operation id"
        )


class HandConflict(WakefulError):
    """The operation id was already used for another tool or other arguments. Fails closed:
    nothing ran. (HTTP 409.)"""

    def __init__(self, operation_id: str, detail: str = "") -> None:
        self.operation_id = operation_id
        super().__init__(
            f"operation {operation_id!r} was already used for another tool or other "
            f"arguments{': ' + detail if detail else ''}; nothing ran (an operation id names "
            f"one call)"
        )


class UnknownTool(WakefulError):
    """The hand has no tool by that name. Nothing ran or was recorded. (HTTP 422.)"""

    def __init__(self, tool: str) -> None:
        self.tool = tool
        super().__init__(f"the hand has no tool named {tool!r}; nothing ran")


class HandRejected(WakefulError):
    """The hand refused the request (an HTTP 4xx other than 409, or an unreadable answer);
    resending it unchanged will not help."""

    def __init__(self, status: int, detail: str) -> None:
        self.status = status
        self.detail = detail
        super().__init__(f"the hand refused the call (HTTP {status}): {detail}")
