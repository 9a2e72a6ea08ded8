"""Chaos child processes: ``python -m tests.chaos.child MODE URL DIR CONFIG_JSON``.

Modes:
  ``worker``: a fleet worker (relay on) running ``tests.chaos.workload`` through
      ``Recording``; with ``drain`` it stops by itself once the store has no pending or
      leased dispatch, nothing running here and nothing staged, three checks in a row;
      with ``wake_url`` it wakes through NATS (``subject``) and polls every ``poll`` s.
  ``writer``: concurrent writers committing to their threads under claims that may lapse
      (random pauses without renewal), so takeovers and stale commits happen; until killed.
  ``relay``: delivers staged outbox entries in small batches; with ``drain`` until empty.
  ``builder``: one sequential writer on a file store, reporting after every acknowledged
      commit the log generation and durable size, then closing cleanly (torn and corrupt
      log trials cut or damage what it wrote).
  ``hand``: the remote hand service (``tests.chaos.handwork``) on ``port``, until killed;
      a ``worker`` with ``hand_url`` runs an agent whose tools call it.

Every mode writes ``up-NAME`` once running and reports through fsynced ledgers in DIR
(``acks-*``, ``effects-*``, ``faults.jsonl``); a ``fault`` in the config kills or stops the
process at an instrumented point, a ``crash_at`` arms the file store's own crash hook."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from tests.chaos import ledger
from tests.chaos.handwork import hand_main, hand_registry
from tests.chaos.probe import PID, Faults, Recording
from tests.chaos.workload import registry
from wakeful import open_store
from wakeful.errors import StaleClaim, StoreUnavailable, ThreadBusy, WakefulError
from wakeful.fleet import NoWake, Worker
from wakeful.fleet.natswake import NatsWake
from wakeful.records import Checkpoint, Commit, EventDraft, Message
from wakeful.runtime import ClaimPolicy
from wakeful.store.contract import Store


def store_options(url: str, cfg: dict[str, Any]) -> dict[str, Any]:
    if url.startswith("postgresql"):
        return {"pool_size": 3, "pool_min_size": 1, "pool_timeout": 5.0}
    if url.startswith("file"):
        return {"compact_bytes": cfg.get("compact_bytes")}
    return {}


async def open_recorded(
    url: str, directory: Path, cfg: dict[str, Any]
) -> tuple[Store, Recording, Faults]:
    raw = await open_store(url, **store_options(url, cfg))
    if cfg.get("crash_at"):
        arm = cast(Any, raw).crash_at
        if cfg.get("crash_after"):
            asyncio.get_running_loop().call_later(float(cfg["crash_after"]), arm, cfg["crash_at"])
        else:
            arm(cfg["crash_at"])
    faults = Faults(directory, cfg.get("fault"))
    recording = Recording(raw, directory / f"acks-{cfg['name']}.jsonl", faults)
    return raw, recording, faults


def up(directory: Path, name: str) -> None:
    (directory / f"up-{name}").write_text(str(PID))


def stop_event() -> asyncio.Event:
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    return stopping


# ---------------------------------------------------------------- worker


async def drained(store: Store, worker: Worker) -> None:
    quiet = 0
    while quiet < 3:
        await asyncio.sleep(0.1)
        try:
            busy = worker.busy > 0
            busy = busy or bool(await store.list_dispatches(status="pending", limit=1))
            busy = busy or bool(await store.list_dispatches(status="leased", limit=1))
            busy = busy or await store.relay_outbox(100) > 0
        except WakefulError:
            busy = True
        quiet = 0 if busy else quiet + 1


async def worker_main(url: str, directory: Path, cfg: dict[str, Any]) -> None:
    raw, recording, faults = await open_recorded(url, directory, cfg)
    store = cast(Store, recording)
    ttl = float(cfg["ttl"])
    wake = NatsWake(str(cfg["wake_url"]), str(cfg["subject"])) if cfg.get("wake_url") else NoWake()
    worker = Worker(
        store,
        hand_registry(faults, int(cfg["seed"]), cfg)
        if cfg.get("hand_url")
        else registry(directory, faults, int(cfg["seed"])),
        concurrency=int(cfg.get("concurrency", 2)),
        claims=ClaimPolicy(ttl=ttl, renew_every=ttl / 4),
        worker_id=cfg["name"],
        wake=wake,
        poll_interval=float(cfg.get("poll", 0.05)),
        retry_backoff=0.05,
        max_retry_backoff=0.5,
        relay=True,
    )
    stopping = stop_event()
    running = asyncio.create_task(worker.run())
    await worker.started()
    up(directory, cfg["name"])
    waits: list[asyncio.Task[Any]] = [asyncio.create_task(stopping.wait())]
    if cfg.get("drain"):
        waits.append(asyncio.create_task(drained(store, worker)))
    waits.append(running)
    _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        if task is not running:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    await worker.stop(grace=5)
    await running
    await wake.close()
    await raw.close()
    ledger.append(directory / f"stats-{cfg['name']}.jsonl", asdict(worker.stats))


# ---------------------------------------------------------------- writer


def write_commit(thread: str, n: int, parent: str | None, token: int, now: datetime) -> Commit:
    checkpoint = Checkpoint(
        id=f"{thread}-cp-{n}",
        parent=parent,
        run_id=f"{thread}-run",
        status="running",
        state={"n": n, "pad": "x" * (n * 37 % 200)},
        created_at=now,
    )
    return Commit(
        token=token,
        checkpoint=checkpoint,
        events=(EventDraft(type="step", data={"n": n, "token": token}),),
        messages=(Message(id=f"{thread}-m-{n}", role="assistant", content=f"step {n}"),),
        operation_id=f"{thread}:{n}",
    )


async def writer_main(url: str, directory: Path, cfg: dict[str, Any]) -> None:
    _, recording, _ = await open_recorded(url, directory, cfg)
    rng = random.Random(int(cfg["seed"]))
    ttl, pause = float(cfg["ttl"]), float(cfg["pause_max"])
    errors = directory / f"errors-{cfg['name']}.jsonl"
    up(directory, cfg["name"])

    async def one(thread: str) -> None:
        while True:
            try:
                claim = await recording.claim(thread, cfg["name"], ttl)
            except (ThreadBusy, StoreUnavailable):
                await asyncio.sleep(rng.uniform(0.005, 0.05))
                continue
            try:
                for _ in range(rng.randint(2, 10)):
                    snap = await recording.read(thread)
                    version = snap.version if snap is not None else 0
                    parent = snap.checkpoint.id if snap and snap.checkpoint else None
                    now = datetime.now(UTC)
                    await recording.commit(
                        thread, write_commit(thread, version + 1, parent, claim.token, now)
                    )
                    if rng.random() < 0.3:
                        await asyncio.sleep(rng.uniform(0.0, pause))  # may outlive the claim
                    if rng.random() < 0.5:
                        await recording.renew(thread, claim.token, ttl)
                await recording.release(thread, claim.token)
            except (StaleClaim, StoreUnavailable):
                pass  # taken over (or busy): claim again
            except WakefulError as exc:
                ledger.append(errors, {"thread": thread, "error": repr(exc)})
            await asyncio.sleep(rng.uniform(0.0, 0.02))

    await asyncio.gather(*(one(t) for t in cfg["threads"]))


# ---------------------------------------------------------------- relay


async def relay_main(url: str, directory: Path, cfg: dict[str, Any]) -> None:
    raw, recording, _ = await open_recorded(url, directory, cfg)
    rng = random.Random(int(cfg["seed"]))
    up(directory, cfg["name"])
    empty = 0
    while empty < 2:
        try:
            handled = await recording.relay_outbox(rng.randint(1, int(cfg["limit_max"])))
        except StoreUnavailable:
            handled = 1
        empty = 0 if handled or not cfg.get("drain") else empty + 1
        await asyncio.sleep(rng.uniform(0.0, float(cfg["pause_max"])))
    await raw.close()


# ---------------------------------------------------------------- builder


async def builder_main(url: str, directory: Path, cfg: dict[str, Any]) -> None:
    from wakeful.store.file import FileStore

    store = await open_store(url, compact_bytes=cfg.get("compact_bytes"))
    assert isinstance(store, FileStore)
    threads: list[str] = cfg["threads"]
    tokens = {t: (await store.claim(t, "builder", 3600)).token for t in threads}
    versions = dict.fromkeys(threads, 0)
    parents: dict[str, str | None] = dict.fromkeys(threads, None)
    rng = random.Random(int(cfg["seed"]))
    for _ in range(int(cfg["count"])):
        thread = rng.choice(threads)
        n = versions[thread] + 1
        commit = write_commit(thread, n, parents[thread], tokens[thread], store.now())
        receipt = await store.commit(thread, commit)
        stats = store.stats
        ledger.append(
            directory / "acks-builder.jsonl",
            {
                "thread": thread,
                "version": receipt.version,
                "generation": stats.generation,
                "size": stats.log_size,
            },
        )
        versions[thread], parents[thread] = n, f"{thread}-cp-{n}"
    await store.close()


MODES = {
    "worker": worker_main,
    "writer": writer_main,
    "relay": relay_main,
    "builder": builder_main,
    "hand": hand_main,
}


def main(argv: list[str]) -> None:
    mode, url, directory, cfg = argv[0], argv[1], Path(argv[2]), json.loads(argv[3])
    asyncio.run(MODES[mode](url, directory, cfg))


if __name__ == "__main__":
    main(sys.argv[1:])
