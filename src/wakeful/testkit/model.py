"""A plain reference model of the thread contract (claims, commits, events, compaction,
deletion), written for clarity rather than speed, so the stateful test can compare a store
against an independent statement of the rules."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import msgspec

from wakeful.records import Commit

Outcome = tuple[Any, ...]
"""``("ok", ...)`` with the interesting parts of a result, or ``(ErrorClassName,)``."""


@dataclass
class ModelThread:
    version: int = 0
    holder: str | None = None
    token: int | None = None
    expires_at: datetime | None = None
    latest: str | None = None
    writes: set[str] = field(default_factory=set)
    next_seq: int = 1
    floor: int = 1
    message_ids: set[str] = field(default_factory=set)
    checkpoint_ids: set[str] = field(default_factory=set)
    receipts: dict[str, tuple[bytes, Outcome]] = field(default_factory=dict)

    def live(self, now: datetime) -> bool:
        return self.expires_at is not None and self.token is not None and now <= self.expires_at


@dataclass
class ReferenceModel:
    now: datetime
    threads: dict[str, ModelThread] = field(default_factory=dict)
    epochs: dict[str, int] = field(default_factory=dict)

    def claim(self, tid: str, holder: str, ttl: float) -> Outcome:
        t = self.threads.get(tid)
        if t is not None and t.live(self.now):
            return ("ThreadBusy", t.holder)
        t = self.threads.setdefault(tid, ModelThread())
        token = self.epochs.get(tid, 0) + 1
        self.epochs[tid] = token
        t.holder, t.token, t.expires_at = holder, token, self.now + timedelta(seconds=ttl)
        return ("ok", token, holder)

    def renew(self, tid: str, token: int, ttl: float) -> Outcome:
        t = self.threads.get(tid)
        if t is None or t.token != token:
            return ("StaleClaim",)
        t.expires_at = self.now + timedelta(seconds=ttl)
        return ("ok", token, t.holder)

    def release(self, tid: str, token: int) -> Outcome:
        t = self.threads.get(tid)
        if t is not None and t.token == token:
            t.holder = t.token = t.expires_at = None
        return ("ok",)

    def commit(self, tid: str, commit: Commit) -> Outcome:
        t = self.threads.get(tid)
        body = msgspec.json.encode(msgspec.structs.replace(commit, token=0), order="sorted")
        if t is None or t.token is None or t.token != commit.token:
            # a commit that ended its own claim answers its retries until a newer claim
            if (
                t is not None
                and t.token is None
                and self.epochs.get(tid, 0) == commit.token
                and commit.operation_id is not None
                and t.receipts.get(commit.operation_id, (None,))[0] == body
            ):
                return t.receipts[commit.operation_id][1]
            # refused all the same; an operation applied with this payload says so
            op = commit.operation_id
            applied = None if t is None or op is None else t.receipts.get(op)
            if applied is not None and applied[0] == body:
                return ("StaleClaim", applied[1])
            return ("StaleClaim",)
        if commit.operation_id is not None and commit.operation_id in t.receipts:
            recorded, replayed = t.receipts[commit.operation_id]
            return replayed if recorded == body else ("OperationConflict",)
        if commit.expected_version is not None and commit.expected_version != t.version:
            return ("VersionConflict",)
        if commit.checkpoint is not None and commit.checkpoint.parent != t.latest:
            return ("VersionConflict",)
        resulting = commit.checkpoint.id if commit.checkpoint is not None else t.latest
        if commit.checkpoint is not None and commit.checkpoint.id in t.checkpoint_ids:
            return ("InvalidCommit",)
        tasks = set() if commit.checkpoint is not None else set(t.writes)
        for write in commit.writes:
            if write.checkpoint_id != resulting or write.task_id in tasks:
                return ("InvalidCommit",)
            tasks.add(write.task_id)
        ids = [m.id for m in commit.messages]
        if len(set(ids)) != len(ids) or t.message_ids & set(ids):
            return ("InvalidCommit",)
        seqs = tuple(range(t.next_seq, t.next_seq + len(commit.events)))
        t.next_seq += len(commit.events)
        if commit.checkpoint is not None:
            t.latest = commit.checkpoint.id
            t.checkpoint_ids.add(commit.checkpoint.id)
        t.writes = tasks
        t.message_ids |= set(ids)
        t.version += 1
        outcome: Outcome = ("ok", t.version, resulting, seqs)
        if commit.operation_id is not None:
            t.receipts[commit.operation_id] = (body, outcome)
        if commit.release:
            t.holder = t.token = t.expires_at = None
        return outcome

    def claim_and_commit(self, tid: str, holder: str, ttl: float, commit: Commit) -> Outcome:
        """``claim`` then ``commit`` as one step: a refused commit leaves no trace."""
        before = (copy.deepcopy(self.threads.get(tid)), self.epochs.get(tid))
        claimed = self.claim(tid, holder, ttl)
        if claimed[0] != "ok":
            return claimed
        committed = self.commit(tid, msgspec.structs.replace(commit, token=claimed[1]))
        if committed[0] != "ok":
            thread, epoch = before
            if thread is None:
                self.threads.pop(tid, None)
            else:
                self.threads[tid] = thread
            if epoch is None:
                self.epochs.pop(tid, None)
            else:
                self.epochs[tid] = epoch
            return committed
        return ("ok", claimed[1], claimed[2], *committed[1:])

    def operation(self, tid: str, operation_id: str) -> Outcome:
        """The outcome the operation was applied with, or ``None``."""
        t = self.threads.get(tid)
        recorded = None if t is None else t.receipts.get(operation_id)
        return ("ok", None if recorded is None else recorded[1])

    def compact(self, tid: str, before_seq: int) -> Outcome:
        t = self.threads.get(tid)
        if t is None:
            return ("ok", 1)
        t.floor = max(t.floor, min(before_seq, t.next_seq))
        return ("ok", t.floor)

    def delete(self, tid: str) -> Outcome:
        if tid in self.threads:
            del self.threads[tid]
            self.epochs[tid] = self.epochs.get(tid, 0) + 1
        return ("ok",)

    def events_after(self, tid: str, after_seq: int) -> Outcome:
        t = self.threads.get(tid)
        if t is None:
            return ("ok", ())
        if after_seq < t.floor - 1:
            return ("ReplayUnavailable", t.floor)
        return ("ok", tuple(range(max(after_seq + 1, t.floor), t.next_seq)))
