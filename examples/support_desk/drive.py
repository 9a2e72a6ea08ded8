"""Drive the support desk over HTTP: submit a customer's message, wait for the refund
approval, approve it, and print the conversation.

``python -m examples.support_desk.drive [--api http://127.0.0.1:8000] [--thread T]
[--token TOKEN] MESSAGE``"""

from __future__ import annotations

import argparse
import time
from typing import Any

import httpx

SETTLED = {"suspended", "completed", "failed", "cancelled", "indeterminate"}


def wait_for(
    api: httpx.Client, thread: str, run_id: str, timeout: float, answered: set[str]
) -> Any:
    """The thread once run ``run_id`` has settled, and not on the tickets just answered."""
    deadline = time.monotonic() + timeout
    while True:
        view = api.get(f"/v1/threads/{thread}")
        if view.status_code == 200:
            data = view.json()
            waiting_on = {t["id"] for t in data["tickets"]}
            ours = data["run_id"] == run_id
            if ours and data["status"] in SETTLED and not waiting_on & answered:
                return data
        if time.monotonic() > deadline:
            raise SystemExit(f"thread {thread} did not settle within {timeout} s")
        time.sleep(0.1)


def wait_ready(api: httpx.Client, timeout: float) -> None:
    """Wait until the API answers ``/readyz`` (it may still be starting, as right after
    ``wakeful serve ... &``)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if api.get("/readyz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"the API at {api.base_url} was not ready within {timeout} s")
        time.sleep(0.1)


def turn(message: dict[str, Any]) -> str:
    """One line of the conversation. A turn in which the model only called tools shows its
    calls (``assistant: calls refund({"order_id": 42})``), not a blank line."""
    content = message.get("content")
    calls = message.get("tool_calls") or []
    if calls and not content:
        shown = ", ".join(f"{c.get('name')}({c.get('arguments') or ''})" for c in calls)
        return f"{message['role']}: calls {shown}"
    return f"{message['role']}: {content}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("message", nargs="?", default="Please refund order 42, it arrived broken.")
    parser.add_argument("--api", default="http://127.0.0.1:8000")
    parser.add_argument("--thread", default="ticket-7")
    parser.add_argument("--token", default=None)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    with httpx.Client(base_url=args.api, headers=headers, timeout=30) as api:
        wait_ready(api, args.timeout)
        body = {"target": "support", "input": args.message}
        accepted = api.post(f"/v1/threads/{args.thread}/runs", json=body)
        accepted.raise_for_status()
        run_id = accepted.json()["run_id"]
        print(f"submitted {accepted.json()['dispatch_id']} (run {run_id})")
        view = wait_for(api, args.thread, run_id, args.timeout, set())
        while view["status"] == "suspended":
            answers = {}
            for ticket in view["tickets"]:
                call = ticket["question"]["approval"]
                print(f"approval asked: {call['tool']}({call['arguments']}) -> approve")
                answers[ticket["id"]] = "approve"
            api.post(f"/v1/threads/{args.thread}/resume", json={"answers": answers})
            view = wait_for(api, args.thread, run_id, args.timeout, set(answers))
        messages = api.get(f"/v1/threads/{args.thread}/messages").json()
        for m in messages["messages"]:
            print(turn(m))
        print(f"run {view['run_id']} {view['status']}")
        if view["status"] != "completed":
            raise SystemExit(1)


if __name__ == "__main__":
    main()
