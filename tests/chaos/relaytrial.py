"""The ``relay_replace`` trial: two threads exchange outbox messages while the elected relay
(``wakeful relay`` with its default claim ttl) is SIGKILLed again and again, a replacement
started right after each kill. Nothing else delivers: every message must reach its target
exactly once, through the relays, and the delivery lag's p99 (staged commit acknowledged ->
message seen in the target's inbox) must stay below ``LAG_BOUND``, the documented bound."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos import checks
from tests.chaos.harness import read_dump, store_options
from tests.chaos.trials import Trial
from tests.cli_support import ROOT, WAKEFUL, cli_env
from wakeful import open_store
from wakeful.fleet.relay import RELAY_TTL
from wakeful.records import Commit, OutboxEntry

THREADS = ("ping", "pong")
LAG_BOUND = RELAY_TTL + 2.0
"""docs/fleet.md: a relay's successor delivers within its claim ttl plus about a step and
its own start-up after the crash (3 s + 2 s with the default ttl)."""


@dataclass
class Exchange:
    """What one exchange staged and saw."""

    staged: dict[str, float] = field(default_factory=dict)
    """message id -> when its commit was acknowledged"""
    targets: dict[str, str] = field(default_factory=dict)
    seen: dict[str, float] = field(default_factory=dict)
    """message id -> when it was first seen in its target's inbox"""
    kills: int = 0
    relays: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def lags(self) -> list[float]:
        return sorted(self.seen[m] - at for m, at in self.staged.items() if m in self.seen)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, -(-len(ordered) * 99 // 100) - 1)]


def start_relay(url: str, directory: Path, n: int) -> subprocess.Popen[bytes]:
    with (directory / f"relay-{n}.log").open("ab") as log:
        return subprocess.Popen(
            [WAKEFUL, "relay", "--store", url],
            cwd=ROOT,
            env=cli_env(url),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )


async def exchange(
    url: str, directory: Path, rng: random.Random, messages: int, kills: int
) -> Exchange:
    """Stage ``messages`` messages, alternating ping -> pong and pong -> ping, every 0.4 s,
    while a killer SIGKILLs the relay ``kills`` times (each once it has delivered, after a
    random 0.1-0.6 s) and starts its replacement at once; then wait (at most 60 s) for every
    message to arrive through the last relay, which is stopped with SIGTERM."""
    ex = Exchange()
    async with open_store(url, **store_options(url)) as store:
        tokens = {t: (await store.claim(t, "stager", 3600)).token for t in THREADS}
        ex.relays.append(start_relay(url, directory, 0))
        started = time.monotonic()

        async def stage() -> None:
            for i in range(messages):
                source, target = THREADS[i % 2], THREADS[1 - i % 2]
                entry = OutboxEntry(message_id=f"m-{i}", target_thread=target, payload={"i": i})
                await store.commit(source, Commit(token=tokens[source], outbox=(entry,)))
                ex.staged[entry.message_id], ex.targets[entry.message_id] = time.monotonic(), target
                await asyncio.sleep(0.4)

        async def watch() -> None:
            while len(ex.seen) < messages:
                for thread in THREADS:
                    for m in await store.inbox(thread):
                        ex.seen.setdefault(m.message_id, time.monotonic())
                await asyncio.sleep(0.05)

        async def kill() -> None:
            nonlocal started
            while ex.kills < kills:
                await asyncio.sleep(0.05)
                if len(ex.seen) >= messages:
                    return  # all delivered: a relay started after that has nothing to deliver
                if not any(at > started for at in ex.seen.values()):
                    continue  # the current relay has not delivered yet
                await asyncio.sleep(rng.uniform(0.1, 0.6))
                ex.relays[-1].send_signal(signal.SIGKILL)
                ex.relays[-1].wait()
                ex.kills += 1
                ex.relays.append(start_relay(url, directory, ex.kills))
                started = time.monotonic()

        watcher = asyncio.create_task(watch())
        try:
            await asyncio.gather(stage(), kill())
            await asyncio.wait_for(asyncio.shield(watcher), 60)
        except TimeoutError:
            pass  # reported by the checks: messages never delivered
        finally:
            watcher.cancel()
            for relay in ex.relays:
                if relay.poll() is None:
                    relay.send_signal(signal.SIGTERM)
                    try:
                        relay.wait(20)
                    except subprocess.TimeoutExpired:
                        relay.kill()
                        relay.wait()
    return ex


def verdict(t: Trial, ex: Exchange, left: int, dump: Any) -> None:
    staged = {(ex.targets[m], m) for m in ex.staged}
    t.violations += checks.delivered(dump, staged, consumed=False) + checks.events_unique(dump)
    if left:
        t.fail("liveness", f"{left} staged entries were never delivered by the relays")
    lags = ex.lags()
    t.notes.update(messages=len(ex.staged), kills=ex.kills, hit=ex.kills > 0)
    if lags:
        t.notes.update(lag_p50=round(lags[len(lags) // 2], 3), lag_p99=round(p99(lags), 3))
        t.notes["lag_max"] = round(lags[-1], 3)
        if p99(lags) >= LAG_BOUND:
            t.fail("liveness", f"delivery lag p99 {p99(lags):.2f} s >= {LAG_BOUND:.1f} s")


async def leftover(url: str) -> int:
    """How many staged entries the relays left (delivered now, so the dump is complete;
    a non-zero count is a liveness failure of the relays)."""
    async with open_store(url, **store_options(url)) as store:
        return int(await store.relay_outbox(1000))


def relay_replace(t: Trial, messages: int | None = None, kills: int | None = None) -> None:
    kills = t.rng.randint(3, 6) if kills is None else kills
    messages = 10 * kills if messages is None else messages
    t.notes["faults"] = [f"SIGKILL the elected relay {kills}x, replaced at once"]
    t.notes["points"] = ["relay killed while elected"]
    ex = asyncio.run(exchange(t.url, t.directory, t.rng, messages, kills))
    left = asyncio.run(leftover(t.url))
    dump = asyncio.run(read_dump(t.url, THREADS))
    verdict(t, ex, left, dump)
