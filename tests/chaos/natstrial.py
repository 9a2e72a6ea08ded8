"""The ``nats_freeze`` trial: workers that wake only through NATS (a private ``nats-server``
of the trial; their polling floor is ``POLL`` seconds) run the chaos workload while the
server is SIGSTOPped for 3-10 s, or SIGKILLed and restarted after 1-5 s. Every submit and
message sent with the wake returns within ``NOTIFY_BOUND`` (plus slack); 5 s after the
server is back, probe messages sent one at a time run within ``PROBE_BOUND`` (wakes flow
again: the polling floor is far longer); the workload finishes as usual."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

from tests.chaos import checks
from tests.chaos.harness import Child, read_dump, store_options
from tests.chaos.trials import TTL, Trial, Workload, make_workload
from tests.nats_server import PrivateNats
from wakeful import open_store
from wakeful.fleet import send_message, submit
from wakeful.fleet.natswake import NatsWake
from wakeful.fleet.wake import NOTIFY_BOUND

POLL = 20.0
"""The workers' polling floor: only a wake makes them look sooner."""
SLACK = 0.5
PROBE_BOUND = 3.0
"""Seconds a probe message may take from ``send_message`` to its dispatch done."""
PROBES = 3
SUBJECT = "wakeful.chaos"


async def submit_with_wake(url: str, work: Workload, wake: NatsWake) -> list[float]:
    spent = []
    async with open_store(url, **store_options(url)) as store:
        for thread, plan in work.agents.items():
            started = time.monotonic()
            await submit(
                store,
                thread,
                "agent",
                {"chaos": plan},
                dispatch_id=f"d-{thread}",
                max_attempts=work.attempts[thread],
                wake=wake,
            )
            spent.append(time.monotonic() - started)
    return spent


async def probe(url: str, wake: NatsWake, n: int) -> tuple[float, float]:
    """Send a message to a fresh thread; (how long the send took, how long until done)."""
    async with open_store(url, **store_options(url)) as store:
        started = time.monotonic()
        d = await send_message(store, f"probe-{n}", {"src": "probe", "i": n}, wake=wake)
        sent = time.monotonic() - started
        while True:
            current = await store.get_dispatch(d.dispatch_id)
            if current is not None and current.status == "done":
                return sent, time.monotonic() - started
            if time.monotonic() - started > 60:
                return sent, float("inf")
            await asyncio.sleep(0.02)


async def settled(url: str, deadline: float) -> bool:
    end = time.monotonic() + deadline
    async with open_store(url, **store_options(url)) as store:
        while time.monotonic() < end:
            pending = await store.list_dispatches(status="pending", limit=1)
            leased = await store.list_dispatches(status="leased", limit=1)
            if not pending and not leased:
                return True
            await asyncio.sleep(0.1)
    return False


def nats_freeze(t: Trial) -> None:
    work = make_workload(t.rng)
    for thread in work.agents:
        work.attempts[thread] = 20  # not this trial's subject
    work.pipelines.clear()
    server = PrivateNats(t.directory)
    server.start()
    try:
        run(t, work, server)
    finally:
        server.stop()


def run(t: Trial, work: Workload, server: PrivateNats) -> None:
    cfg: dict[str, Any] = {"ttl": TTL, "wake_url": server.url, "subject": SUBJECT, "poll": POLL}
    workers: list[Child] = [t.spawn("worker", {"name": f"w{i}", **cfg}) for i in range(2)]
    if not all(t.wait_up(w) for w in workers):
        return
    freeze = t.rng.random() < 0.6
    down = t.rng.uniform(3.0, 10.0) if freeze else t.rng.uniform(1.0, 5.0)
    pause = t.rng.uniform(0.1, 1.0)
    what = f"{'SIGSTOP' if freeze else 'SIGKILL + restart'} for {down:.1f} s"
    t.notes["faults"] = [what]
    t.notes["points"] = ["nats frozen" if freeze else "nats killed and restarted"]
    asyncio.run(fault(t, work, server, freeze, down, pause))
    for w in workers:
        w.send(signal.SIGTERM)
    for w in workers:
        if not w.wait(30):
            t.fail("liveness", f"{w.name} did not stop on SIGTERM")
    threads = (*work.threads, *(f"probe-{n}" for n in (0, 1, *range(10, 10 + PROBES))))
    dump = asyncio.run(read_dump(t.url, threads))
    t.violations += checks.finished(dump, threads) + checks.events_unique(dump)
    for thread in work.agents:
        t.violations += checks.conversation(dump.thread(thread), 8)


async def fault(
    t: Trial, work: Workload, server: PrivateNats, freeze: bool, down: float, pause: float
) -> None:
    async with NatsWake(server.url, SUBJECT) as wake:
        await wake.listen()
        spent = await submit_with_wake(t.url, work, wake)
        await asyncio.sleep(pause)
        t.notes["hit"] = not await settled(t.url, 0)
        if freeze:
            server.freeze()
        else:
            server.kill()
        try:
            spent += [await probe_send(t.url, wake, n) for n in range(2)]
            await asyncio.sleep(down)  # the fault: the server is frozen or dead this long
        finally:
            if freeze:
                server.thaw()
            else:
                await asyncio.to_thread(server.start)
        await asyncio.sleep(5.0)
        probes = [await probe(t.url, wake, 10 + n) for n in range(PROBES)]
        spent += [sent for sent, _ in probes]
        latencies = [took for _, took in probes]
        t.notes["probe_latency"] = [round(x, 3) for x in latencies]
        t.notes["notify_max"] = round(max(spent), 3)
        if max(spent) >= NOTIFY_BOUND + SLACK:
            t.fail("liveness", f"a submit with the wake took {max(spent):.2f} s")
        if max(latencies) >= PROBE_BOUND:
            t.fail("liveness", f"probes 5 s after the fault ended took {latencies} s")
        if not await settled(t.url, 90):
            t.fail("liveness", "the workload did not finish within 90 s")


async def probe_send(url: str, wake: NatsWake, n: int) -> float:
    """A message sent while the server is down: only how long the send took."""
    async with open_store(url, **store_options(url)) as store:
        started = time.monotonic()
        await send_message(store, f"probe-{n}", {"src": "probe", "i": n}, wake=wake)
        return time.monotonic() - started
