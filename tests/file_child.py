"""Helpers for the file store tests: a workload that produces records of every kind, and a
child process entry point (run as ``python tests/file_child.py MODE ROOT ...``).

Modes:
  ``commit ROOT TAG``: commit in a loop from four concurrent writers; after each commit
      returns, print ``ack THREAD VERSION CHECKPOINT`` (so every printed line is an
      acknowledged commit). Runs until killed.
  ``commit-hold ROOT TAG``: as ``commit``, but the first refused commit (``StoreUnavailable``)
      prints ``refused`` and stops the writers; the store stays open until stdin closes.
  ``try-open ROOT``: open the root once and print ``locked`` (StoreLocked) or ``opened``.
  ``hold ROOT``: open the root, print ``ready``, keep it open until stdin closes.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta
from pathlib import Path

from wakeful.clock import ManualClock
from wakeful.errors import StoreLocked, StoreUnavailable
from wakeful.records import (
    Awaiting,
    Checkpoint,
    Commit,
    Dispatch,
    Done,
    EventDraft,
    Message,
    OutboxEntry,
    PendingWrite,
    RetentionPolicy,
    Retry,
)
from wakeful.store.file import FileStore, open_file_store


def checkpoint(cp_id: str, parent: str | None, clock: ManualClock, **state: object) -> Checkpoint:
    return Checkpoint(
        id=cp_id,
        parent=parent,
        run_id="run-1",
        status="running",
        state=state,
        created_at=clock.now(),
    )


async def mixed_workload(
    store: FileStore, clock: ManualClock, rounds: int = 3, tag: str = ""
) -> None:
    """Every kind of mutation record, ``rounds`` times over (27 records a round); ``tag``
    keeps the ids of several runs over one store apart."""
    for n in range(rounds):
        r = f"{tag}{n}"
        a, b = f"ta-{r}", f"tb-{r}"
        claim = await store.claim(a, "h1", 30)
        cp1 = checkpoint(f"cp-{r}-1", None, clock, step=1, text="héllo 🙂")
        await store.commit(
            a,
            Commit(
                token=claim.token,
                checkpoint=cp1,
                writes=(PendingWrite(checkpoint_id=cp1.id, task_id="t", node="n", value=[1]),),
                events=(EventDraft(type="started", data={"r": n}), EventDraft(type="x")),
                messages=(Message(id=f"m-{r}", role="user", content="hi"),),
                outbox=(OutboxEntry(message_id=f"o-{r}", target_thread=b, payload={"p": n}),),
                operation_id=f"op-{r}",
            ),
        )
        await store.renew(a, claim.token, 60)
        clock.advance(1)
        cp2 = checkpoint(f"cp-{r}-2", cp1.id, clock, step=2)
        await store.commit(
            a, Commit(token=claim.token, checkpoint=cp2, events=(EventDraft(type="y"),))
        )
        await store.compact_events(a, 2)
        assert await store.relay_outbox() == 1
        await store.release(a, claim.token)
        await store.enqueue(Dispatch(dispatch_id=f"d-{r}", thread_id=a, kind="start"))
        await store.enqueue(
            Dispatch(dispatch_id=f"e-{r}", thread_id=f"tc-{r}", kind="resume", max_attempts=1)
        )
        leases = await store.claim_next("w1", 30, limit=5)
        for lease in leases:
            if lease.dispatch.thread_id == a:
                await store.settle(lease.dispatch.dispatch_id, lease.claim.token, Awaiting())
            elif lease.dispatch.kind == "message":
                await store.settle(lease.dispatch.dispatch_id, lease.claim.token, Done())
            else:
                await store.settle(
                    lease.dispatch.dispatch_id, lease.claim.token, Retry(delay=0, error="boom")
                )
        exhausted = await store.get_dispatch(f"e-{r}")
        assert exhausted is not None and exhausted.status == "pending" and exhausted.exhausted
        await store.quarantine(exhausted.dispatch_id)
        await store.requeue(exhausted.dispatch_id)
        for lease in await store.claim_next("w2", 30, limit=5):
            await store.settle(lease.dispatch.dispatch_id, lease.claim.token, Done())
        await store.cancel(b, "stop")
        identity = await store.register_worker(f"w-{r}")
        clock.advance(1)
        await store.heartbeat(identity)
        claim_b = await store.claim(b, "h2", 5)
        await store.commit(b, Commit(token=claim_b.token, consume=(f"o-{r}",)))
        await store.delete_thread(f"tc-{r}")
        done = await store.list_dispatches(status="done")
        if done:
            await store.purge(done[0].dispatch_id)
        clock.advance(timedelta(seconds=2).total_seconds())
        await store.prune(RetentionPolicy(keep_checkpoints=1, receipt_max_age=3600.0))


# ------------------------------------------------------------------ child process


async def _commit_forever(root: Path, tag: str, hold: bool = False) -> None:
    store = await open_file_store(root.as_uri(), compact_bytes=50_000)
    if hold:
        try:
            await _commit(store, tag)
        except StoreUnavailable as exc:
            print(f"refused {exc}", flush=True)
        await asyncio.to_thread(sys.stdin.read)
        await store.close()
    else:
        await _commit(store, tag)


async def _commit(store: FileStore, tag: str) -> None:

    async def writer(k: int) -> None:
        thread = f"{tag}-{k}"
        claim = await store.claim(thread, "child", 3600)
        parent = None
        for n in range(1, 1_000_000):
            cp = Checkpoint(
                id=f"{thread}-cp-{n}",
                parent=parent,
                run_id="run-1",
                status="running",
                state={"n": n, "pad": "x" * (n % 300)},
                created_at=store.now(),
            )
            receipt = await store.commit(
                thread,
                Commit(
                    token=claim.token,
                    checkpoint=cp,
                    events=(EventDraft(type="step"),),
                    messages=(Message(id=f"m-{n}", role="assistant", content="ok"),),
                ),
            )
            sys.stdout.write(f"ack {thread} {receipt.version} {cp.id}\n")
            sys.stdout.flush()
            parent = cp.id

    await asyncio.gather(*(writer(k) for k in range(4)))


async def _try_open(root: Path) -> None:
    try:
        store = await open_file_store(root.as_uri())
    except StoreLocked:
        print("locked", flush=True)
        return
    print("opened", flush=True)
    await store.close()


async def _hold(root: Path) -> None:
    store = await open_file_store(root.as_uri())
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.read)
    await store.close()


def main(argv: list[str]) -> None:
    mode, root = argv[0], Path(argv[1])
    if mode == "commit":
        asyncio.run(_commit_forever(root, argv[2]))
    elif mode == "commit-hold":
        asyncio.run(_commit_forever(root, argv[2], hold=True))
    elif mode == "try-open":
        asyncio.run(_try_open(root))
    elif mode == "hold":
        asyncio.run(_hold(root))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
