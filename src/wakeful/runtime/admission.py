"""A new run's admission: its first checkpoint and commit, built from the thread as read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from wakeful.clock import Clock
from wakeful.errors import RunInProgress
from wakeful.records import Checkpoint, Commit, EventDraft, Message, ThreadSnapshot
from wakeful.runtime.graph import START, CompiledGraph
from wakeful.runtime.results import frontier_entries
from wakeful.runtime.spans import traced_metadata


class Admission:
    """A new run's first checkpoint and commit, built from the thread as read."""

    def __init__(
        self,
        graph: CompiledGraph,
        input: Mapping[str, Any] | None,
        durability: str,
        tenant: str | None,
        run_id: str,
        messages: Sequence[Message],
        consume: Sequence[str],
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        self.graph = graph
        self.input = dict(input or {})
        self.durability = durability
        self.tenant = tenant
        self.run_id = run_id
        self.messages = tuple(messages)
        self.consume = tuple(consume)
        self.metadata = dict(metadata or {})
        self.trace: dict[str, str] = {}
        """The admitting attempt's trace context, recorded in the first checkpoint."""
        self.history: list[Message] | None = None
        """After ``build``: the thread's conversation once the first commit is applied, if
        the thread as read had no messages (then it is exactly ``messages``), else None."""

    def build(
        self, thread_id: str, snap: ThreadSnapshot | None, clock: Clock, token: int = 0
    ) -> tuple[Checkpoint, Commit]:
        """Raises ``RunInProgress`` while the thread's last run is unfinished. The commit is
        under ``token`` (0 for ``claim_and_commit``, whose claim supplies it)."""
        latest = snap.checkpoint if snap is not None else None
        if graph_patches := self.graph.patches:  # what ``ctx.patched`` answers for this run
            self.metadata["patches"] = list(graph_patches)
        if latest is not None and latest.status in ("running", "suspended"):
            raise RunInProgress(thread_id, latest.run_id, latest.status)
        empty = snap is None or snap.message_count == 0
        # as the store returns them (JSON values), so the known history equals a read's
        self.history = list(_as_stored(self.messages)) if empty else None
        graph = self.graph
        state = graph.apply(dict(latest.state or {}) if latest else {}, dict(self.input))
        tasks = graph.next_tasks(START, state)
        first = Checkpoint(
            id=f"{self.run_id}-c0",
            parent=latest.id if latest is not None else None,
            run_id=self.run_id,
            status="running",
            state=state,
            created_at=clock.now(),
            tenant=self.tenant,
            frontier=frontier_entries(0, tasks),
            metadata=traced_metadata(
                {
                    **self.metadata,
                    "step": 0,
                    "ordinal": 0,
                    "graph": graph.name,
                    "fingerprint": graph.fingerprint,
                    "durability": self.durability,
                    "source": "input",
                    "nodes": [],
                    "messages": (snap.message_count if snap is not None else 0)
                    + len(self.messages),
                },
                self.trace,
            ),
        )
        started = {"graph": graph.name}
        for key in ("version", "patches", "parent"):  # its code (issue 40), its parent run
            if key in self.metadata:
                started[key] = self.metadata[key]
        event = EventDraft(
            type="run.started",
            data=started,
            run_id=self.run_id,
            checkpoint_id=first.id,
        )
        commit = Commit(
            token=token,
            checkpoint=first,
            events=(event,),
            messages=self.messages,
            consume=self.consume,
            operation_id=first.id,
        )
        return first, commit


_MESSAGES = msgspec.json.Decoder(tuple[Message, ...])


def _as_stored(messages: tuple[Message, ...]) -> tuple[Message, ...]:
    """``messages`` as a read returns them once committed: their JSON values decoded."""
    return _MESSAGES.decode(msgspec.json.encode(messages)) if messages else ()
