"""``python -m examples.messaging [--store URL] [--orders N]``: place N orders and run two
workers (one per service, each with the relay) until every order is paid. The store is
``--store``, else ``$WAKEFUL_STORE`` (as for the ``wakeful`` command), else
``sqlite:///messaging.db``."""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from examples.messaging.app import registry
from wakeful import open_store
from wakeful.fleet import LocalWake, Worker, submit


async def main(store_url: str, orders: int, timeout: float) -> int:
    async with open_store(store_url) as store:
        wake = LocalWake()
        workers = [
            Worker(store, registry(), concurrency=4, wake=wake, worker_id=name, poll_interval=0.2)
            for name in ("orders-service", "billing-service")
        ]
        running = [asyncio.create_task(w.run()) for w in workers]
        for n in range(1, orders + 1):
            order = {"order_id": n, "amount_cents": 1000 * n}
            await submit(store, f"order-{n}", "orders", order, dispatch_id=f"place-{n}", wake=wake)
        deadline = time.monotonic() + timeout
        paid: dict[int, object] = {}
        while len(paid) < orders and time.monotonic() < deadline:
            for n in range(1, orders + 1):
                snap = await store.read(f"order-{n}")
                cp = snap.checkpoint if snap is not None else None
                if cp is not None and cp.state.get("status") == "paid":
                    paid[n] = cp.state["invoice"]
            await asyncio.sleep(0.1)
        for w in workers:
            await w.stop(5)
        await asyncio.gather(*running)
        for n, invoice in sorted(paid.items()):
            print(f"order-{n}: paid, invoice {invoice}")
        print(f"{len(paid)} of {orders} orders paid")
        return 0 if len(paid) == orders else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--store", default=os.environ.get("WAKEFUL_STORE") or "sqlite:///messaging.db"
    )
    parser.add_argument("--orders", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    raise SystemExit(asyncio.run(main(args.store, args.orders, args.timeout)))
