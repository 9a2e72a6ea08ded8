"""``wakeful demo --claims``: a short scripted story on the memory store.

Two holders race for one thread: exactly one wins and the loser is told who holds it. The
winner commits, then stalls past its claim's expiry; the other takes the thread over, and the
stalled writer's late commit is refused. Time is a manual clock, so the story is exact.
"""

from __future__ import annotations

import asyncio

from wakeful import (
    Checkpoint,
    Claim,
    Commit,
    EventDraft,
    ManualClock,
    StaleClaim,
    ThreadBusy,
    open_store,
)


def say(text: str) -> None:
    print(text, flush=True)


async def story() -> int:
    clock = ManualClock()
    async with open_store("memory://", clock=clock) as store:
        say("1. alice and bob race to claim thread 'order-42' (ttl 30 s)")
        results = await asyncio.gather(
            store.claim("order-42", "alice", 30),
            store.claim("order-42", "bob", 30),
            return_exceptions=True,
        )
        winner = next(r for r in results if isinstance(r, Claim))
        loser = next(r for r in results if isinstance(r, ThreadBusy))
        other = "bob" if winner.holder == "alice" else "alice"
        say(f"   {winner.holder} wins with token {winner.token}")
        say(f"   {other} is refused: {loser}")

        cp = Checkpoint(
            id="cp-1",
            parent=None,
            run_id="run-1",
            status="running",
            state={"step": "charged card"},
            created_at=clock.now(),
        )
        receipt = await store.commit(
            "order-42",
            Commit(token=winner.token, checkpoint=cp, events=(EventDraft(type="card.charged"),)),
        )
        say(
            f"2. {winner.holder} commits checkpoint cp-1: version {receipt.version}, "
            f"event seqs {list(receipt.events)}"
        )

        say(f"3. {winner.holder}'s process freezes; 31 s pass and its claim expires")
        clock.advance(31)
        successor = await store.claim("order-42", other, 30)
        say(f"   {other} takes over with token {successor.token} (> {winner.token})")

        late = Checkpoint(
            id="cp-2",
            parent="cp-1",
            run_id="run-1",
            status="completed",
            state={"step": "charged card twice"},
            created_at=clock.now(),
        )
        try:
            await store.commit("order-42", Commit(token=winner.token, checkpoint=late))
        except StaleClaim as refused:
            say(f"4. {winner.holder} wakes and tries to commit: refused")
            say(f"   {refused}")
        else:
            say("4. BUG: the stale writer's commit was accepted")
            return 1

        snap = await store.read("order-42")
        assert snap is not None and snap.checkpoint is not None
        events = await store.events_after("order-42")
        say(
            f"5. the thread holds only committed facts: checkpoint {snap.checkpoint.id}, "
            f"version {snap.version}, events {[(e.seq, e.type) for e in events]}, "
            f"claim held by {snap.claim.holder if snap.claim else None}"
        )
    return 0


def main() -> None:
    raise SystemExit(asyncio.run(story()))


if __name__ == "__main__":
    main()
