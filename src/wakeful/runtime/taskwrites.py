"""The writes a running task makes against its run's current checkpoint, outside its
result: marks (``ctx.mark``) and a subgraph's progress. A part of ``Execution``."""

from __future__ import annotations

from wakeful.errors import InvalidInput
from wakeful.records import (
    Checkpoint,
    Claim,
    Commit,
    EventDraft,
    Message,
    OutboxEntry,
    PendingWrite,
)
from wakeful.runtime.durability import Writer


class TaskWrites:
    """Mixed into ``Execution``, which provides the attributes below."""

    __slots__ = ()
    checkpoint: Checkpoint
    claim: Claim
    durability: str
    writes: dict[str, PendingWrite]
    _writer: Writer

    @property
    def run_id(self) -> str:
        return self.checkpoint.run_id

    def _fenced(self, cause: BaseException) -> None:
        raise NotImplementedError

    def _recorded(self, messages: tuple[Message, ...]) -> None:
        raise NotImplementedError

    async def commit_writes(
        self,
        writes: tuple[PendingWrite, ...],
        events: tuple[EventDraft, ...] = (),
        messages: tuple[Message, ...] = (),
        outbox: tuple[OutboxEntry, ...] = (),
        now: bool = False,
    ) -> None:
        """Commit writes against the current checkpoint (a mark, a subgraph's progress):
        through the durability mode's writer, or synchronously (``now``)."""
        cp = self.checkpoint
        commit = Commit(
            token=self.claim.token,
            writes=writes,
            events=events,
            messages=messages,
            outbox=outbox,
            operation_id=f"{cp.id}:{writes[0].task_id}",
        )
        try:
            await (self._writer.commit_now(commit) if now else self._writer.submit(commit))
        except Exception as exc:
            self._fenced(exc)
            raise
        self._recorded(messages)
        self.writes.update((w.task_id, w) for w in writes)

    async def commit_mark(self, task_id: str, node: str, name: str) -> None:
        if self.durability == "exit":
            raise InvalidInput("durability", "a task mark needs sync or async durability")
        mark_id = f"{task_id}.mark.{name}"
        write = PendingWrite(
            checkpoint_id=self.checkpoint.id, task_id=mark_id, node=node, value={"mark": name}
        )
        event = EventDraft(
            type="task.marked", data={"mark": name}, run_id=self.run_id, task_id=task_id
        )
        await self.commit_writes((write,), (event,), now=True)

    def has_mark(self, task_id: str, name: str) -> bool:
        return f"{task_id}.mark.{name}" in self.writes
