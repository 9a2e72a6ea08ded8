"""The invariants, checked by the parent from what the store holds (a ``Dump``) and what the
children reported in their fsynced ledgers.

1. ``acknowledged``: every acknowledged commit is there whole (its checkpoint, its events at
   the numbers its receipt gave, its messages); an acknowledged ``Done`` settle stays done;
   every staged message of an acknowledged commit is delivered.
2. ``duplicate``: no fact recorded twice: event numbers contiguous; per run at most one
   ``run.started``, one terminal event, one ``task.completed`` per task, one
   ``step.completed`` per step, one ``fact`` per task; per thread unique message ids and a
   well-formed conversation (one user message per run, one result per committed call); per
   message one inbox entry, one dispatch, one processing run; and a task or tool call whose
   result was acknowledged is never executed again by the same or a later claim.
3. ``stale``: no acknowledged commit, renewal, settle or stream-checkpoint put under token T
   started after a claim with a greater token on that thread had been granted (monotonic
   times from every process); per thread the tokens recorded in events never decrease; and
   (SIGSTOP trials) the store is unchanged by a woken paused process.
4. ``incomplete-call``: a tool runs only for a committed call whose arguments parse as a
   complete JSON object and validate, with exactly those arguments; planned invalid,
   incomplete or unknown-tool calls never run.
5. ``replay``: a ``never`` tool's effect happens at most once per call; every attempt of a
   ``keyed`` call uses the same key, no two calls share a key, so a downstream system that
   deduplicates by key applies each call at most once.
6. ``hand``: a call through the remote hand is recorded as the hand's ledger says: ``ok``
   only with the ledger's result, ``indeterminate`` (with one ``tool.indeterminate`` event)
   only when the ledger has no result, ``error`` only as ``HandUnavailable`` for a call the
   ledger never saw.
"""

from __future__ import annotations

import bisect
import json
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from tests.chaos.harness import Dump, ThreadDump
from tests.chaos.workload import TOOLS, call_id

TERMINAL = ("run.completed", "run.failed", "run.cancelled", "run.indeterminate")
INVARIANTS = {
    "acknowledged": "1. nothing acknowledged is lost",
    "duplicate": "2. no committed fact is duplicated",
    "stale": "3. no stale write is accepted",
    "incomplete-call": "4. no incomplete tool call is executed",
    "replay": "5. never at most once, keyed applied at most once",
    "hand": "6. a hand call is recorded as the hand's ledger says, an error only if unseen",
    "fail-closed": "a corrupt log is refused and left unchanged",
    "liveness": "the work finishes after the faults (not a safety invariant)",
    "harness": "the trial itself failed (a bug in the harness or an unexpected error)",
}


@dataclass(frozen=True)
class Violation:
    invariant: str
    detail: str


def ops(acks: Iterable[dict[str, Any]], *names: str) -> list[dict[str, Any]]:
    return [a for a in acks if a.get("op") in names]


# ---------------------------------------------------------------- 1. acknowledged


def acknowledged(dump: Dump, acks: list[dict[str, Any]]) -> list[Violation]:
    found: list[Violation] = []
    for a in ops(acks, "commit"):
        t = dump.thread(a["thread"])
        where = f"commit {a.get('operation') or a['version']} on {a['thread']} (pid {a['pid']})"
        if t.snap is None or t.snap.version < a["version"]:
            found.append(Violation("acknowledged", f"{where}: thread version is behind"))
            continue
        if a["checkpoint"] and a["checkpoint"] not in {c.id for c in t.checkpoints}:
            found.append(Violation("acknowledged", f"{where}: checkpoint {a['checkpoint']} lost"))
        by_seq = {e.seq: e for e in t.events}
        for seq, kind in zip(a["seqs"], a["types"], strict=False):
            event = by_seq.get(seq)
            if event is None or event.type != kind:
                got = event.type if event else "nothing"
                found.append(Violation("acknowledged", f"{where}: event {seq} {kind} is {got}"))
        ids = {m.id for m in t.messages}
        for mid in a["messages"]:
            if mid not in ids:
                found.append(Violation("acknowledged", f"{where}: message {mid} lost"))
    for a in ops(acks, "settle"):
        d = dump.dispatches.get(a["dispatch"])
        if a["outcome"] == "done" and (d is None or d.status != "done"):
            status = d.status if d else "missing"
            found.append(
                Violation("acknowledged", f"settle Done of {a['dispatch']} is now {status}")
            )
    for a in ops(acks, "enqueue"):
        if a["dispatch"] not in dump.dispatches:
            found.append(Violation("acknowledged", f"submitted dispatch {a['dispatch']} lost"))
    return found


# ---------------------------------------------------------------- 3. stale


def stale(acks: list[dict[str, Any]]) -> list[Violation]:
    """An acknowledged fenced write that *started* after a newer claim on its thread had
    been granted (the grant returned to its claimant before the write was sent)."""
    grants: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for g in ops(acks, "grant"):
        grants[g["thread"]].append((g["t1"], g["token"]))
    prefix: dict[str, tuple[list[float], list[int]]] = {}
    for thread, items in grants.items():
        items.sort()
        best, times, tokens = 0, [], []
        for t1, token in items:
            best = max(best, token)
            times.append(t1)
            tokens.append(best)
        prefix[thread] = (times, tokens)
    found: list[Violation] = []
    for a in ops(acks, "commit", "renew", "settle", "put"):
        times, tokens = prefix.get(a["thread"], ([], []))
        i = bisect.bisect_left(times, a["t0"])
        if i and tokens[i - 1] > a["token"]:
            found.append(
                Violation(
                    "stale",
                    f"{a['op']} on {a['thread']} under token {a['token']} (pid {a['pid']}) "
                    f"was accepted although token {tokens[i - 1]} had been granted "
                    f"{a['t0'] - times[i - 1]:.3f} s before it was sent",
                )
            )
    return found


def token_order(dump: Dump) -> list[Violation]:
    found: list[Violation] = []
    for t in dump.threads.values():
        last = 0
        for e in t.events:
            token = e.data.get("token") if isinstance(e.data, dict) else None
            if not isinstance(token, int):
                continue
            if token < last:
                found.append(
                    Violation(
                        "stale",
                        f"{t.thread_id}: event {e.seq} ({e.type}) written under token {token} "
                        f"after an event under token {last}",
                    )
                )
            last = max(last, token)
    return found


def unchanged(before: Dump, after: Dump, skip: tuple[str, ...]) -> list[Violation]:
    a, b = before.signature(skip), after.signature(skip)
    found = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            found.append(
                Violation(
                    "stale",
                    f"the woken paused worker changed {key}: {a.get(key)} -> {b.get(key)}",
                )
            )
    return found


# ---------------------------------------------------------------- 2. duplicates


def events_unique(dump: Dump) -> list[Violation]:
    found: list[Violation] = []
    for t in dump.threads.values():
        seqs = [e.seq for e in t.events]
        floor = t.snap.event_floor if t.snap else 1
        last = t.snap.last_seq if t.snap else 0
        if seqs != list(range(floor, last + 1)):
            found.append(Violation("duplicate", f"{t.thread_id}: event numbers {seqs}"))
        counts: Counter[tuple[Any, ...]] = Counter()
        for e in t.events:
            if (e.type == "run.started" or e.type in TERMINAL) and e.run_id is not None:
                counts[("start" if e.type == "run.started" else "end", e.run_id)] += 1
            elif e.type in ("task.completed", "fact"):
                counts[(e.type, e.run_id, e.task_id)] += 1
            elif e.type == "step.completed" and isinstance(e.data, dict):
                counts[(e.type, e.run_id, e.data.get("step"))] += 1
            elif e.type == "task.marked" and isinstance(e.data, dict):
                counts[(e.type, e.run_id, e.task_id, e.data.get("mark"))] += 1
        for key, n in counts.items():
            if n > 1:
                found.append(Violation("duplicate", f"{t.thread_id}: {key} recorded {n} times"))
        ids = Counter(m.id for m in t.messages)
        for mid, n in ids.items():
            if n > 1:
                found.append(Violation("duplicate", f"{t.thread_id}: message {mid} {n} times"))
    return found


def no_rerun(acks: list[dict[str, Any]], effects: list[dict[str, Any]]) -> list[Violation]:
    """A task or tool call whose result was acknowledged never starts again under the same
    or a later token."""
    tasks: dict[tuple[str, str], tuple[float, int]] = {}
    results: dict[tuple[str, str], tuple[float, int]] = {}
    for a in ops(acks, "commit"):
        for run, task in a["tasks"]:
            key = (str(run), str(task))
            tasks[key] = min(tasks.get(key, (a["t1"], a["token"])), (a["t1"], a["token"]))
        for call in a["results"]:
            key = (a["thread"], str(call))
            results[key] = min(results.get(key, (a["t1"], a["token"])), (a["t1"], a["token"]))
    found: list[Violation] = []
    for e in effects:
        if e["what"] == "tool":
            done = results.get((e["thread"], e["call"]))
            what = f"tool call {e['call']} on {e['thread']}"
        else:
            done = tasks.get((e["run"], e["task"]))
            what = f"task {e['task']} of {e['run']}"
        if done is not None and e["t0"] > done[0] and e["token"] >= done[1]:
            found.append(
                Violation(
                    "duplicate",
                    f"{what} ran again under token {e['token']} (pid {e['pid']}) "
                    f"{e['t0'] - done[0]:.3f} s after its result was acknowledged "
                    f"under token {done[1]}",
                )
            )
    return found


# ---------------------------------------------------------------- agents: 2, 4, 5


def conversation(t: ThreadDump, max_steps: int) -> list[Violation]:
    found: list[Violation] = []
    name = t.thread_id
    runs = Counter(m.run_id for m in t.messages if m.role == "user")
    for run, n in runs.items():
        if n != 1:
            found.append(Violation("duplicate", f"{name}: {n} user messages for {run}"))
    open_calls: set[str] | None = None
    answered: set[str] = set()
    turns = 0
    for m in t.messages:
        if m.role == "user":
            continue
        if m.role == "assistant":
            if open_calls:
                found.append(
                    Violation(
                        "duplicate",
                        f"{name}: assistant turn {m.id} before results of {sorted(open_calls)}",
                    )
                )
            turns += 1
            open_calls = {str(c.get("id")) for c in m.tool_calls if c.get("id")}
            continue
        call = str(m.tool_call_id)
        if call in answered:
            found.append(Violation("duplicate", f"{name}: second result for call {call}"))
        elif open_calls is None or call not in open_calls:
            found.append(Violation("duplicate", f"{name}: result for uncommitted call {call}"))
        else:
            open_calls.discard(call)
        answered.add(call)
    if turns > max_steps:
        found.append(Violation("duplicate", f"{name}: {turns} model turns (limit {max_steps})"))
    return found


def committed_calls(t: ThreadDump) -> dict[str, dict[str, Any]]:
    calls: dict[str, dict[str, Any]] = {}
    for m in t.messages:
        if m.role == "assistant":
            for c in m.tool_calls:
                calls[str(c.get("id"))] = dict(c)
    return calls


def valid_arguments(raw: Any) -> dict[str, Any] | None:
    try:
        value = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return None
    if not isinstance(value, dict) or set(value) != {"n"} or type(value["n"]) is not int:
        return None
    return value


def tool_calls(
    t: ThreadDump, plan: dict[str, Any], effects: list[dict[str, Any]]
) -> list[Violation]:
    found: list[Violation] = []
    name = t.thread_id
    calls = committed_calls(t)
    results = {str(m.tool_call_id): m for m in t.messages if m.role == "tool"}
    planned = {
        call_id(k, i): c
        for k, turn in enumerate(plan["turns"])
        for i, c in enumerate(turn["calls"])
    }
    by_call: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in effects:
        if e["what"] == "tool" and e["thread"] == name:
            by_call[e["call"]].append(e)
    for cid, runs in by_call.items():
        committed = calls.get(cid)
        spec = planned.get(cid)
        if committed is None:
            found.append(Violation("incomplete-call", f"{name}: {cid} ran but was never committed"))
            continue
        args = valid_arguments(committed.get("arguments"))
        if args is None:
            found.append(
                Violation(
                    "incomplete-call",
                    f"{name}: {cid} ran although its arguments "
                    f"{committed.get('arguments')!r} are incomplete or invalid",
                )
            )
        if spec is not None and spec.get("bad"):
            found.append(Violation("incomplete-call", f"{name}: planned-{spec['bad']} {cid} ran"))
        for e in runs:
            if e["args"] != args or not e["int"]:
                found.append(
                    Violation("incomplete-call", f"{name}: {cid} ran with {e['args']}, not {args}")
                )
            if TOOLS[e["kind"]] != committed.get("name"):
                found.append(Violation("incomplete-call", f"{name}: {cid} ran the wrong tool"))
        kinds = {e["kind"] for e in runs}
        if "never" in kinds and len(runs) > 1:
            found.append(Violation("replay", f"{name}: never tool {cid} ran {len(runs)} times"))
        if "keyed" in kinds and len({e["key"] for e in runs}) != 1:
            keys = sorted({e["key"] for e in runs})
            found.append(Violation("replay", f"{name}: keyed call {cid} ran with keys {keys}"))
        result = results.get(cid)
        outcome = result.metadata.get("outcome") if result is not None else None
        if outcome == "invalid":
            found.append(
                Violation("incomplete-call", f"{name}: {cid} ran yet its result is invalid")
            )
    for cid, committed in calls.items():
        result = results.get(cid)
        if result is None:
            continue
        outcome = result.metadata.get("outcome")
        spec = planned.get(cid)
        bad = bool(spec and spec.get("bad")) or valid_arguments(committed.get("arguments")) is None
        if bad and outcome != "invalid":
            found.append(
                Violation("incomplete-call", f"{name}: invalid call {cid} got outcome {outcome}")
            )
        if outcome == "ok" and committed.get("name") == TOOLS["never"] and not by_call.get(cid):
            found.append(Violation("replay", f"{name}: never call {cid} reported ok, never ran"))
    return found


def keys_distinct(effects: list[dict[str, Any]]) -> list[Violation]:
    owners: dict[str, set[tuple[str, str]]] = defaultdict(set)
    applied: Counter[str] = Counter()
    for e in effects:
        if e["what"] == "tool" and e["kind"] == "keyed":
            owners[e["key"]].add((e["thread"], e["call"]))
            applied[e["key"]] += bool(e["applied"])
    found = [
        Violation("replay", f"calls {sorted(calls)} share the idempotency key {key}")
        for key, calls in owners.items()
        if len(calls) > 1
    ]
    found += [
        Violation("replay", f"key {key} applied {n} times downstream")
        for key, n in applied.items()
        if n > 1
    ]
    return found


# ---------------------------------------------------------------- messages between threads


def delivered(dump: Dump, staged: set[tuple[str, str]], consumed: bool) -> list[Violation]:
    """Every staged message reached its target once: one message dispatch, and either one
    inbox entry (``consumed=False``) or one processing run with its fact (``consumed=True``)."""
    found: list[Violation] = []
    targets = {target for target, _ in staged}
    for target in sorted(targets):
        want = {mid for tgt, mid in staged if tgt == target}
        dispatches = Counter(
            str((d.payload or {}).get("message_id"))
            for d in dump.dispatches.values()
            if d.thread_id == target and d.kind == "message"
        )
        for mid in sorted(want):
            if dispatches[mid] == 0:
                found.append(Violation("acknowledged", f"staged message {mid} never delivered"))
        for mid, n in dispatches.items():
            if n > 1:
                found.append(Violation("duplicate", f"message {mid} has {n} dispatches"))
        t = dump.thread(target)
        inbox = Counter(m.message_id for m in t.inbox)
        for mid, n in inbox.items():
            if n > 1:
                found.append(Violation("duplicate", f"message {mid} in {target}'s inbox {n} times"))
        if not consumed:
            revisions = [m.revision for m in t.inbox]
            if revisions != list(range(1, len(revisions) + 1)):
                found.append(Violation("duplicate", f"{target}: inbox revisions {revisions}"))
            for mid in sorted(want - set(inbox)):
                found.append(Violation("acknowledged", f"staged message {mid} not in the inbox"))
    return found


def received(dump: Dump, inbox_threads: set[str]) -> list[Violation]:
    found: list[Violation] = []
    for target in sorted(inbox_threads):
        facts = Counter(
            str(e.data.get("message"))
            for e in dump.thread(target).events
            if e.type == "fact" and isinstance(e.data, dict)
        )
        for message, n in facts.items():
            if n > 1:
                found.append(Violation("duplicate", f"{target}: message {message} processed {n}x"))
    return found


# ---------------------------------------------------------------- outcome (liveness)


def finished(
    dump: Dump, threads: Iterable[str], exhaustible: Collection[str] = ()
) -> list[Violation]:
    """Every dispatch done, every run completed (or, for a dispatch with a budget of one
    attempt that was redelivered, ``indeterminate`` with exactly one ``run.indeterminate``),
    every inbox consumed."""
    found: list[Violation] = []
    for d in dump.dispatches.values():
        if d.status != "done":
            found.append(
                Violation("liveness", f"dispatch {d.dispatch_id} is {d.status} ({d.last_error})")
            )
    for tid in threads:
        t = dump.thread(tid)
        status = t.checkpoints[-1].status if t.checkpoints else None
        marked = sum(1 for e in t.events if e.type == "run.indeterminate")
        if tid in exhaustible and marked and status in (None, "indeterminate"):
            if marked != 1:
                found.append(Violation("duplicate", f"{tid}: {marked} run.indeterminate events"))
        elif status != "completed":
            found.append(Violation("liveness", f"{tid} ended {status}"))
        if t.inbox:
            found.append(Violation("liveness", f"{tid} still has {len(t.inbox)} inbox messages"))
    return found


# ---------------------------------------------------------------- writer threads


def writer_threads(dump: Dump, threads: Iterable[str]) -> list[Violation]:
    """A writer commits checkpoint n with message n and one event carrying n: a thread at
    version V holds exactly those, in order, each once."""
    found: list[Violation] = []
    for tid in threads:
        t = dump.thread(tid)
        v = t.snap.version if t.snap else 0
        want_cps = [f"{tid}-cp-{n}" for n in range(1, v + 1)]
        if [c.id for c in t.checkpoints] != want_cps:
            found.append(
                Violation("duplicate", f"{tid}: checkpoints {[c.id for c in t.checkpoints]}")
            )
        parents = [c.parent for c in t.checkpoints]
        if parents != [None, *want_cps[:-1]][: len(parents)]:
            found.append(Violation("duplicate", f"{tid}: checkpoint parents {parents}"))
        if [m.id for m in t.messages] != [f"{tid}-m-{n}" for n in range(1, v + 1)]:
            found.append(Violation("duplicate", f"{tid}: messages {[m.id for m in t.messages]}"))
        data = [e.data.get("n") if isinstance(e.data, dict) else None for e in t.events]
        if data != list(range(1, v + 1)):
            found.append(Violation("duplicate", f"{tid}: events carry {data}"))
    return found


# ---------------------------------------------------------------- remote hand


def hand_calls(
    dump: Dump,
    threads: Iterable[str],
    records: dict[str, tuple[str, str | None, str | None]],
    effects: list[dict[str, Any]],
) -> list[Violation]:
    """``records``: the hand's ledger (operation id: status, result JSON, error);
    ``effects``: the hand tools' executions (each names its call's key)."""
    found: list[Violation] = []
    for key, n in Counter(str(e["key"]) for e in effects).items():
        if n > 1:
            found.append(Violation("replay", f"the hand ran call {key} {n} times"))
    for tid in threads:
        t = dump.thread(tid)
        flagged = Counter(
            str(e.data.get("call_id")) for e in t.events if e.type == "tool.indeterminate"
        )
        for m in t.messages:
            if m.role != "tool":
                continue
            call, outcome = str(m.tool_call_id), m.metadata.get("outcome")
            record = records.get(m.id.removeprefix("m-").removesuffix("-r"))
            if outcome == "ok":
                if (
                    record is None
                    or record[0] != "done"
                    or record[2] is not None
                    or json.loads(record[1] or "null") != json.loads(str(m.content))
                ):
                    found.append(
                        Violation(
                            "hand", f"{tid}: {call} recorded ok, the hand's ledger has {record}"
                        )
                    )
            elif outcome == "indeterminate":
                if record is not None and record[0] == "done":
                    found.append(
                        Violation("hand", f"{tid}: {call} recorded indeterminate, ledger: {record}")
                    )
                if flagged[call] != 1:
                    found.append(
                        Violation("hand", f"{tid}: {call} has {flagged[call]} tool.indeterminate")
                    )
            elif not (outcome == "error" and "HandUnavailable" in str(m.content) and not record):
                # HandUnavailable is the one honest error: the call never reached the hand
                # (connection refused on every attempt), so the ledger must not know it.
                found.append(Violation("hand", f"{tid}: {call} recorded {outcome}: {m.content}"))
    return found
