"""The queue half of ``ProjectedStore``: dispatches, leases, workers, inboxes and the relay,
over the same projection and with the same atomicity (no ``await`` between planning a
mutation and applying it)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import msgspec

from wakeful.concurrency import KeyUse
from wakeful.errors import (
    DispatchConflict,
    InvalidInput,
    InvalidState,
    NotFound,
    StaleClaim,
    ThreadBusy,
    WorkerSuperseded,
)
from wakeful.ids import check_count, check_id, check_seconds
from wakeful.records import (
    Claim,
    Dispatch,
    DispatchStatus,
    InboxMessage,
    Lease,
    Outcome,
    WorkerIdentity,
    WorkerInfo,
)
from wakeful.store.intents import cancel_intent as cancel_intent
from wakeful.store.intents import fencing_intent as fencing_intent
from wakeful.store.intents import interrupt_reason as interrupt_reason
from wakeful.store.intents import run_id_of as run_id_of
from wakeful.store.keyslots import key_of_resume
from wakeful.store.kinds import DISPATCH_KINDS
from wakeful.store.pins import (
    MOVABLE,
    check_migration,
    check_running,
    claimable_by,
    live_versions,
    migrated_event,
    pin_of_resume,
    pin_on_lease,
)
from wakeful.store.projected_core import (
    ProjectedCore,
    check_thread_tenant,
    claim_of,
    snapshot_of,
)
from wakeful.store.projected_due import due_record
from wakeful.store.projection import (
    CLAIMABLE,
    Cancelled,
    Debounced,
    Delivered,
    Enqueued,
    Leased,
    LeaseGrant,
    PinsReleased,
    Purged,
    Quarantined,
    Requeued,
    State,
    Unstaged,
    WorkerBeat,
    WorkerRegistered,
    WorkerRetired,
    settled_record,
)
from wakeful.store.validate import (
    check_outcome,
    check_text,
    check_token,
)
from wakeful.store.validate_queue import (
    FENCING,
    QUEUE_DEPTH_STATUSES,
    RUN_KINDS,
    check_depth_limit,
    check_dispatch,
    check_listing,
    check_version,
    same_request,
)


class ProjectedQueue(ProjectedCore):
    """The dispatch queue, worker registry, inboxes and outbox relay of the contract."""

    async def enqueue(self, dispatch: Dispatch) -> Dispatch:
        d = check_dispatch(dispatch)
        if d.kind not in DISPATCH_KINDS:
            raise InvalidInput("kind", f"must be one of {sorted(DISPATCH_KINDS)}")
        state, now = self._open(), self._now()
        check_thread_tenant(state, d.thread_id, d.tenant)
        existing = state.dispatches.get(d.dispatch_id)
        if existing is None and d.dedupe_key is not None:
            by_key = state.dedupe.get(d.dedupe_key)
            existing = state.dispatches.get(by_key) if by_key is not None else None
        if existing is not None:
            if same_request(existing, d):
                return existing
            key = "dispatch_id" if existing.dispatch_id == d.dispatch_id else "dedupe_key"
            raise DispatchConflict(d.dispatch_id, existing.dispatch_id, key)
        due = d.available_at or now
        if d.debounce_key is not None and due > now:
            folded = _debounce_target(state, d)
            if folded is not None:
                await self._record(Debounced(folded, d.payload, due, now))
                return state.dispatches[folded]
        stored = msgspec.structs.replace(
            d,
            available_at=due,
            status="pending",
            attempts=0,
            token=None,
            holder=None,
            lease_until=None,
            last_error=None,
            created_at=now,
            updated_at=now,
            queued_behind=None,
            coalesced=(),
            answered_by=None,
            pinned_version=pin_of_resume(state.slot_holder(d.thread_id))
            if d.kind == "resume"
            else None,
            released_from=None,
        )
        if d.kind == "resume":
            stored = key_of_resume(stored, state.slot_holder(d.thread_id))
        fence = None
        if due > now:
            stored = msgspec.structs.replace(stored, status="scheduled")  # admitted when due
        elif d.kind in RUN_KINDS:
            stored, fence = _admission(state, stored, now)
        await self._record(Enqueued(stored, fence))
        return state.dispatches[stored.dispatch_id]  # its key may have made it wait

    async def concurrency_keys(self) -> list[KeyUse]:
        return self._open().keys.use()

    async def claim_next(
        self,
        holder: str,
        ttl: float,
        limit: int = 1,
        thread_id: str | None = None,
        *,
        version: str | None = None,
        take_starts: bool = True,
    ) -> list[Lease]:
        check_id("holder", holder)
        check_version(version)
        ttl = check_seconds("ttl", ttl)
        limit = check_count("limit", limit, minimum=1, maximum=1000)
        if thread_id is not None:
            check_id("thread_id", thread_id)
        state, now = self._open(), self._now()
        due = due_record(state, now)
        if due is not None:
            await self._record(due)
        expires = now + timedelta(seconds=ttl)
        grants: list[LeaseGrant] = []
        taken: set[str] = set()
        for *_, did in _candidates(state, thread_id):
            if len(grants) == limit:
                break
            d = state.dispatches[did]
            if d.thread_id in taken or not _available(state, d, now):
                continue
            if not claimable_by(d, version, take_starts):
                continue
            taken.add(d.thread_id)
            token = state.epochs.get(d.thread_id, 0) + 1
            grants.append(
                LeaseGrant(
                    d.dispatch_id,
                    Claim(thread_id=d.thread_id, holder=holder, token=token, expires_at=expires),
                    pin_on_lease(d, version),
                )
            )
        if not grants:
            return []
        await self._record(Leased(tuple(grants), now))
        leases = []
        for grant in grants:
            d = state.dispatches[grant.dispatch_id]
            leases.append(
                Lease(
                    dispatch=d,
                    claim=grant.claim,
                    exhausted=d.attempts > d.max_attempts,
                    snapshot=snapshot_of(state.threads[d.thread_id]),
                )
            )
        return leases

    async def settle(self, dispatch_id: str, token: int, outcome: Outcome) -> Dispatch:
        check_id("dispatch_id", dispatch_id)
        check_token(token)
        check_outcome(outcome)
        state, now = self._open(), self._now()
        d = state.dispatches.get(dispatch_id)
        if d is None:
            raise NotFound("dispatch", dispatch_id)
        epoch = state.epochs.get(d.thread_id, 0)
        if d.status != "leased" or d.token != token or epoch != token:
            current = claim_of(state, d.thread_id)
            raise StaleClaim(d.thread_id, token, current.token if current else None)
        await self._record(settled_record(d, token, outcome, now))
        return state.dispatches[dispatch_id]

    async def cancel(self, thread_id: str, reason: str) -> Dispatch:
        check_id("thread_id", thread_id)
        check_text("reason", reason)
        state, now = self._open(), self._now()
        for did in state.open_by_thread.get(thread_id, ()):
            d = state.dispatches[did]
            if d.kind == "cancel" and d.status == "pending":
                return d
        dispatch = cancel_intent(thread_id, reason, now)
        epoch = state.epochs.get(thread_id, 0) + 1
        await self._record(Cancelled(thread_id, reason, epoch, dispatch, now))
        return state.dispatches[dispatch.dispatch_id]

    async def get_dispatch(self, dispatch_id: str) -> Dispatch | None:
        check_id("dispatch_id", dispatch_id)
        return self._open().dispatches.get(dispatch_id)

    async def list_dispatches(
        self,
        status: DispatchStatus | None = None,
        thread_id: str | None = None,
        after: str | None = None,
        limit: int = 100,
        tenant: str | None = None,
    ) -> list[Dispatch]:
        limit = check_listing(status, thread_id, after, limit, tenant)
        state = self._open()
        floor = state.dispatch_order.get(after, 0) if after is not None else 0
        if after is not None and after not in state.dispatch_order:
            raise NotFound("dispatch cursor", after)

        def visible(d: Dispatch) -> bool:
            if tenant is None:
                return True
            owner = state.threads.get(d.thread_id)
            return owner is not None and owner.tenant == tenant and d.tenant in (None, tenant)

        rows = [
            d
            for d in state.dispatches.values()
            if state.dispatch_order[d.dispatch_id] > floor
            and (status is None or d.status == status)
            and (thread_id is None or d.thread_id == thread_id)
            and visible(d)
        ]
        rows.sort(key=lambda d: state.dispatch_order[d.dispatch_id])
        return rows[:limit]

    async def queue_depths(self, limit: int = 10_000) -> dict[DispatchStatus, int]:
        limit = check_depth_limit(limit)
        counts: dict[DispatchStatus, int] = dict.fromkeys(QUEUE_DEPTH_STATUSES, 0)
        for d in self._open().dispatches.values():
            if d.status in counts:
                counts[d.status] += 1
        return {status: min(count, limit) for status, count in counts.items()}

    async def quarantine(self, dispatch_id: str) -> Dispatch:
        state, d = self._dispatch(dispatch_id)
        if d.status == "quarantined":
            return d
        now = self._now()
        live = d.status == "leased" and _lease_live(state, d, now)
        held = d.released_from is not None  # on_version_change="hold" (issue 40)
        if d.status not in ("pending", "leased") or live or not (d.exhausted or held):
            raise InvalidState(
                "dispatch",
                dispatch_id,
                f"{d.status} after {d.attempts} of {d.max_attempts} attempts"
                + (" with a live lease" if live else ""),
                "only exhausted work that no worker holds can be quarantined",
            )
        await self._record(Quarantined(dispatch_id, now))
        return state.dispatches[dispatch_id]

    async def requeue(self, dispatch_id: str) -> Dispatch:
        state, d = self._dispatch(dispatch_id)
        if d.status != "quarantined":
            raise InvalidState(
                "dispatch", dispatch_id, d.status, "only quarantined work is requeued"
            )
        await self._record(Requeued(dispatch_id, self._now()))
        return state.dispatches[dispatch_id]

    async def purge(self, dispatch_id: str) -> None:
        _, d = self._dispatch(dispatch_id)
        if d.status not in ("quarantined", "done"):
            raise InvalidState(
                "dispatch", dispatch_id, d.status, "only quarantined or done work can be purged"
            )
        await self._record(Purged(dispatch_id, self._now()))

    def _dispatch(self, dispatch_id: str) -> tuple[State, Dispatch]:
        check_id("dispatch_id", dispatch_id)
        state = self._open()
        d = state.dispatches.get(dispatch_id)
        if d is None:
            raise NotFound("dispatch", dispatch_id)
        return state, d

    async def release_pins(self, pin_grace: float, limit: int = 100) -> list[Dispatch]:
        pin_grace = check_seconds("pin_grace", pin_grace)
        limit = check_count("limit", limit, minimum=1, maximum=1000)
        state, now = self._open(), self._now()
        alive = live_versions(state.workers.values(), now, pin_grace)
        moved = [
            d.dispatch_id
            for d in state.dispatches.values()
            if d.pinned_version is not None
            and d.pinned_version not in alive
            and (d.status == "pending" or (d.status == "leased" and not _lease_live(state, d, now)))
        ][:limit]
        if not moved:
            return []
        await self._record(PinsReleased(tuple(moved), now))
        return [state.dispatches[did] for did in moved]

    async def migrate_runs(
        self, from_version: str, to_version: str, limit: int = 100
    ) -> list[Dispatch]:
        from_version, to_version, limit = check_migration(from_version, to_version, limit)
        state, now = self._open(), self._now()
        check_running(state.workers.values(), to_version)
        moved = [
            d
            for d in state.dispatches.values()
            if d.pinned_version == from_version
            and d.status in MOVABLE
            and not (d.status == "leased" and _lease_live(state, d, now))
        ][:limit]
        if not moved:
            return []
        events = []
        for d in moved:
            t = state.threads.get(d.thread_id)
            latest = t.latest if t is not None else None
            run_id = latest.run_id if latest is not None else None
            as_moved = msgspec.structs.replace(d, pinned_version=to_version)
            events.append((d.thread_id, migrated_event(as_moved, from_version, run_id)))
        ids = tuple(d.dispatch_id for d in moved)
        await self._record(PinsReleased(ids, now, to_version, tuple(events)))
        for tid in {d.thread_id for d in moved}:
            self._notify(tid)
        return [state.dispatches[did] for did in ids]

    # ------------------------------------------------------------ workers

    async def register_worker(
        self, worker_id: str, *, version: str | None = None
    ) -> WorkerIdentity:
        check_id("worker_id", worker_id)
        check_version(version)
        state, now = self._open(), self._now()
        previous = state.workers.get(worker_id)
        info = WorkerInfo(
            worker_id=worker_id,
            incarnation_id=uuid.uuid4().hex,
            generation=(previous.generation if previous else 0) + 1,
            registered_at=now,
            last_heartbeat=now,
            version=version,
        )
        await self._record(WorkerRegistered(info))
        return WorkerIdentity(
            worker_id=worker_id, incarnation_id=info.incarnation_id, generation=info.generation
        )

    async def heartbeat(self, identity: WorkerIdentity) -> None:
        self._current_worker(identity)
        await self._record(WorkerBeat(identity.worker_id, self._now()))

    async def retire_worker(self, identity: WorkerIdentity) -> WorkerInfo:
        current = self._current_worker(identity)
        if current.stopped_at is None:
            await self._record(WorkerRetired(identity.worker_id, self._now()))
        return self._open().workers[identity.worker_id]

    def _current_worker(self, identity: WorkerIdentity) -> WorkerInfo:
        """The registry entry of ``identity``; ``WorkerSuperseded`` if a newer one exists."""
        check_id("worker_id", identity.worker_id)
        current = self._open().workers.get(identity.worker_id)
        if current is None:
            raise NotFound("worker", identity.worker_id)
        if (current.generation, current.incarnation_id) != (
            identity.generation,
            identity.incarnation_id,
        ):
            raise WorkerSuperseded(identity.worker_id, identity.generation, current.generation)
        return current

    async def list_workers(self) -> list[WorkerInfo]:
        return sorted(self._open().workers.values(), key=lambda w: w.worker_id)

    # ------------------------------------------------------------ inbox / outbox

    async def inbox(self, thread_id: str) -> list[InboxMessage]:
        check_id("thread_id", thread_id)
        t = self._open().threads.get(thread_id)
        return [] if t is None else sorted(t.inbox.values(), key=lambda m: m.revision)

    async def relay_outbox(self, limit: int = 100) -> int:
        limit = check_count("limit", limit, minimum=1)
        state = self._open()
        handled = 0
        for stage_seq in sorted(state.outbox)[:limit]:
            staged = state.outbox.get(stage_seq)
            if staged is None:
                continue
            entry, now = staged.entry, self._now()
            target = state.threads.get(entry.target_thread)
            message = None
            if target is None or entry.message_id not in target.delivered:
                message = InboxMessage(
                    message_id=entry.message_id,
                    correlation_id=entry.correlation_id,
                    payload=entry.payload,
                    revision=(target.inbox_revision if target else 0) + 1,
                    at=now,
                    source_thread=staged.source_thread,
                )
            dispatch_id = message_dispatch_id(entry.target_thread, entry.message_id)
            dispatch = None
            if dispatch_id not in state.dispatches:
                dispatch = Dispatch(
                    dispatch_id=dispatch_id,
                    thread_id=entry.target_thread,
                    kind="message",
                    payload={"message_id": entry.message_id},
                    dedupe_key=dispatch_id,
                    available_at=now,
                    created_at=now,
                    updated_at=now,
                )
                dispatch, _ = _admission(state, dispatch, now)
            await self._record(Delivered(stage_seq, entry.target_thread, message, dispatch))
            self._fault("relay.after_append")
            await self._record(Unstaged(stage_seq))
            handled += 1
        return handled


# ---------------------------------------------------------------- helpers


def message_dispatch_id(target_thread: str, message_id: str) -> str:
    """The id of the ``message`` dispatch for one delivery: stable, in the id alphabet."""
    import hashlib

    digest = hashlib.sha256(f"{target_thread}\x00{message_id}".encode()).hexdigest()[:40]
    return f"msg-{digest}"


def _admission(state: State, d: Dispatch, now: datetime) -> tuple[Dispatch, Cancelled | None]:
    """``d`` as a busy thread takes it (``queued`` behind the last in line, or pending on a
    free thread), with the cancellation that ``interrupt`` makes of the busy run. ``reject``
    on a busy thread is ``ThreadBusy`` naming the slot's holder."""
    holder = state.slot_holder(d.thread_id)
    waiting = state.queued.get(d.thread_id)
    if holder is None and not waiting:
        return d, None
    if holder is not None:
        busy = holder
    else:
        assert waiting  # (checked above)
        busy = state.dispatches[waiting[0]]
    if d.if_busy == "reject":
        raise ThreadBusy(
            d.thread_id, busy.holder, None, run_id=run_id_of(busy), dispatch_id=busy.dispatch_id
        )
    behind = waiting[-1] if waiting else busy.dispatch_id
    queued = msgspec.structs.replace(d, status="queued", queued_behind=behind)
    fence = None
    if d.if_busy in FENCING and holder is not None and holder.kind != "cancel":
        intent = fencing_intent(d, now)
        reason = str(intent.payload["reason"])
        epoch = state.epochs.get(d.thread_id, 0) + 1
        fence = Cancelled(d.thread_id, reason, epoch, intent, now)
    return queued, fence


def _debounce_target(state: State, d: Dispatch) -> str | None:
    """The still ``scheduled`` dispatch of ``d``'s thread and ``debounce_key``, if any."""
    for did in state.open_by_thread.get(d.thread_id, ()):
        other = state.dispatches[did]
        if other.status == "scheduled" and other.debounce_key == d.debounce_key:
            return did
    return None


def _lease_live(state: State, d: Dispatch, now: datetime) -> bool:
    claim = claim_of(state, d.thread_id)
    return claim is not None and claim.token == d.token and claim.is_live(now)


def _candidates(state: State, thread_id: str | None) -> list[tuple[int, float, int, str]]:
    """The claimable dispatches in claim order: all of them, or only ``thread_id``'s (from
    its open dispatches, without walking the queue)."""
    if thread_id is None:
        return state.claimable  # already in claim order
    return sorted(
        (-d.priority, d.fair_tag, state.dispatch_order[did], did)
        for did in state.open_by_thread.get(thread_id, ())
        if (d := state.dispatches[did]).status in CLAIMABLE
    )


def _available(state: State, d: Dispatch, now: datetime) -> bool:
    claim = claim_of(state, d.thread_id)
    if claim is not None and claim.is_live(now):
        return False
    if d.status == "pending":
        return d.available_at is None or d.available_at <= now
    return d.status == "leased"
