"""Conformance cases: branches of a thread's history (``Commit.branch_from``), the message
views they define, and history reads (``history``, ``get_checkpoint``, ``branches``)."""

from __future__ import annotations

import pytest

from wakeful.errors import InvalidCommit, InvalidInput, NotFound, StaleClaim
from wakeful.records import Checkpoint, Claim, Commit, Dispatch, EventDraft, Message
from wakeful.testkit.harness import Harness, Kit

case = pytest.mark.asyncio


def _message(text: str) -> Message:
    return Message(id=f"m-{text}", role="user", content=text)


async def _line(kit: Kit, thread_id: str, length: int) -> tuple[Claim, list[Checkpoint]]:
    """A claimed thread with ``length`` checkpoints, oldest first; checkpoint ``i``'s commit
    appends message ``m-a{i}``."""
    claim = await kit.claimed(thread_id)
    line: list[Checkpoint] = []
    for i in range(length):
        cp = kit.checkpoint(line[-1].id if line else None)
        commit = Commit(token=claim.token, checkpoint=cp, messages=(_message(f"a{i}"),))
        await kit.store.commit(thread_id, commit)
        line.append(cp)
    return claim, line


async def _texts(kit: Kit, thread_id: str, branch: int | None = None) -> list[str]:
    if branch is None:
        found = await kit.store.messages(thread_id, 0, 1000)
    else:
        found = await kit.store.branch_messages(thread_id, branch, 0, 1000)
    return [m.content for m in found]


def _branch(claim: Claim, fork: Checkpoint, new: Checkpoint, kept: int, *texts: str) -> Commit:
    return Commit(
        token=claim.token,
        checkpoint=new,
        messages=tuple(_message(t) for t in texts),
        branch_from=fork.id,
        branch_messages=kept,
        events=(EventDraft(type="thread.branched"),),
        operation_id=f"branch-{new.id}",
    )


class BranchCases(Harness):
    @case
    async def test_a_branch_moves_the_head_and_keeps_the_abandoned_line_readable(
        self, kit: Kit
    ) -> None:
        claim, line = await _line(kit, "t1", 5)
        new = kit.checkpoint(line[1].id)
        receipt = await kit.store.commit("t1", _branch(claim, line[1], new, 2, "b0"))
        assert receipt.version == 6 and receipt.checkpoint_id == new.id
        snap = await kit.store.read("t1")
        assert snap is not None and snap.checkpoint == new and snap.branch == 1
        assert snap.message_count == 3
        assert await _texts(kit, "t1") == ["a0", "a1", "b0"]
        # nothing committed is gone: the abandoned line's checkpoints and messages read back
        assert await _texts(kit, "t1", 0) == ["a0", "a1", "a2", "a3", "a4"]
        assert [cp.id for cp, _ in await kit.store.checkpoints("t1")] == [
            new.id,
            *[cp.id for cp in reversed(line)],
        ]
        (record,) = await kit.store.branches("t1")
        assert (record.number, record.parent, record.fork_point, record.old_head) == (
            1,
            0,
            line[1].id,
            line[4].id,
        )
        assert (record.checkpoint_id, record.messages, record.message_start) == (new.id, 2, 5)
        # the branch goes on as any line does: commits append to its view
        after = kit.checkpoint(new.id)
        await kit.store.commit(
            "t1", Commit(token=claim.token, checkpoint=after, messages=(_message("b1"),))
        )
        assert await _texts(kit, "t1") == ["a0", "a1", "b0", "b1"]
        assert [m.content for m in await kit.store.messages("t1", 1, 2)] == ["a1", "b0"]
        reopened = await kit.reopen()
        assert [m.content for m in await reopened.messages("t1", 0, 100)] == [
            "a0",
            "a1",
            "b0",
            "b1",
        ]
        snap = await reopened.read("t1")
        assert snap is not None and snap.branch == 1 and snap.message_count == 4
        assert len(await reopened.branches("t1")) == 1

    @case
    @pytest.mark.parametrize("only_thread", [False, True])
    async def test_a_lease_snapshot_counts_the_head_branchs_messages(
        self, kit: Kit, only_thread: bool
    ) -> None:
        claim, line = await _line(kit, "t1", 4)
        new = kit.checkpoint(line[0].id)
        await kit.store.commit("t1", _branch(claim, line[0], new, 1, "b0"))
        await kit.store.release("t1", claim.token)
        await kit.store.enqueue(Dispatch(dispatch_id="d-1", thread_id="t1", kind="start"))
        (lease,) = await kit.store.claim_next("w", 30, thread_id="t1" if only_thread else None)
        snap = await kit.store.read("t1")
        assert snap is not None and snap.message_count == 2
        assert lease.snapshot is not None and lease.snapshot.message_count == 2

    @case
    async def test_history_names_each_checkpoints_branch_newest_first_in_pages(
        self, kit: Kit
    ) -> None:
        claim, line = await _line(kit, "t1", 4)
        first = kit.checkpoint(line[1].id)
        await kit.store.commit("t1", _branch(claim, line[1], first, 2, "b0"))
        # a branch from the abandoned line: its view is that line's, as of the fork point
        second = kit.checkpoint(line[2].id)
        await kit.store.commit("t1", _branch(claim, line[2], second, 3, "c0"))
        assert await _texts(kit, "t1") == ["a0", "a1", "a2", "c0"]
        assert await _texts(kit, "t1", 1) == ["a0", "a1", "b0"]
        assert await _texts(kit, "t1", 0) == ["a0", "a1", "a2", "a3"]
        page = await kit.store.history("t1", limit=3)
        assert [(e.checkpoint.id, e.branch) for e in page] == [
            (second.id, 2),
            (first.id, 1),
            (line[3].id, 0),
        ]
        assert page[0].order > page[1].order > page[2].order
        rest = await kit.store.history("t1", before=page[-1].checkpoint.id, limit=10)
        assert [(e.checkpoint.id, e.branch) for e in rest] == [
            (line[2].id, 0),
            (line[1].id, 0),
            (line[0].id, 0),
        ]
        one = await kit.store.get_checkpoint("t1", first.id)
        assert one is not None and one.checkpoint == first and one.branch == 1
        assert one.committed_at == page[1].committed_at
        assert await kit.store.get_checkpoint("t1", "cp-unknown") is None
        assert await kit.store.history("t1", before="cp-unknown") == []
        assert await kit.store.history("never-seen") == []
        records = await kit.store.branches("t1")
        assert [(b.number, b.parent, b.fork_point, b.old_head) for b in records] == [
            (1, 0, line[1].id, line[3].id),
            (2, 0, line[2].id, first.id),
        ]

    @case
    async def test_a_refused_branch_changes_nothing_and_the_token_is_checked_first(
        self, kit: Kit
    ) -> None:
        claim, line = await _line(kit, "t1", 3)
        with pytest.raises(InvalidCommit):  # a fork point not in the history
            await kit.store.commit(
                "t1",
                Commit(
                    token=claim.token,
                    checkpoint=kit.checkpoint("cp-unknown"),
                    branch_from="cp-unknown",
                ),
            )
        with pytest.raises(InvalidCommit):  # more messages than the fork point's view has
            await kit.store.commit("t1", _branch(claim, line[0], kit.checkpoint(line[0].id), 4))
        with pytest.raises(InvalidInput):  # the new checkpoint must continue the fork point
            await kit.store.commit("t1", _branch(claim, line[0], kit.checkpoint(line[1].id), 1))
        with pytest.raises(InvalidInput):  # a branch needs a new checkpoint
            await kit.store.commit(
                "t1", Commit(token=claim.token, branch_from=line[0].id, branch_messages=1)
            )
        with pytest.raises(StaleClaim):
            await kit.store.commit(
                "t1",
                _branch(
                    Claim(
                        thread_id="t1",
                        holder="x",
                        token=claim.token + 7,
                        expires_at=claim.expires_at,
                    ),
                    line[0],
                    kit.checkpoint(line[0].id),
                    99,
                ),
            )
        snap = await kit.store.read("t1")
        assert snap is not None and snap.version == 3 and snap.branch == 0
        assert snap.checkpoint == line[2] and await kit.store.branches("t1") == []
        assert await _texts(kit, "t1") == ["a0", "a1", "a2"]

    @case
    async def test_a_retried_branch_returns_its_receipt_and_branches_once(self, kit: Kit) -> None:
        claim, line = await _line(kit, "t1", 3)
        commit = _branch(claim, line[0], kit.checkpoint(line[0].id), 1, "b0")
        receipt = await kit.store.commit("t1", commit)
        assert await kit.store.commit("t1", commit) == receipt
        assert len(await kit.store.branches("t1")) == 1
        assert await _texts(kit, "t1") == ["a0", "b0"]

    @case
    async def test_claim_and_commit_can_branch_and_delete_removes_the_branches(
        self, kit: Kit
    ) -> None:
        claim, line = await _line(kit, "t1", 2)
        await kit.store.release("t1", claim.token)
        new = kit.checkpoint(line[0].id)
        granted, receipt = await kit.store.claim_and_commit(
            "t1", "holder-b", 30, _branch(claim, line[0], new, 0, "b0")
        )
        assert receipt.checkpoint_id == new.id
        assert await _texts(kit, "t1") == ["b0"]
        assert await _texts(kit, "t1", 0) == ["a0", "a1"]
        await kit.store.release("t1", granted.token)
        await kit.store.delete_thread("t1")
        assert await kit.store.branches("t1") == []
        assert await kit.store.history("t1") == []
        claim, line = await _line(kit, "t1", 1)
        snap = await kit.store.read("t1")
        assert snap is not None and snap.branch == 0 and snap.message_count == 1
        with pytest.raises(NotFound):
            await kit.store.branch_messages("t1", 1)
