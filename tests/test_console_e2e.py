"""The console end to end: real ``wakeful serve`` and ``wakeful worker`` processes over one
SQLite store, the local model server, and Debian's Chromium driven by Playwright. Every wait
is Playwright's (or a poll) with a deadline. Each view is photographed (into docs/console/
with ``WAKEFUL_SCREENSHOTS=docs``)."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from tests.console_support import (
    ALPHA,
    BETA,
    CHROMIUM_ARGS,
    OPERATOR,
    SHOTS,
    Fleet,
    chromium_or_skip,
    fleet,
    wait_until,
    with_store,
)
from tests.provider_server import Reply, openai_text
from wakeful.records import Checkpoint, Commit, EventDraft

pytestmark = pytest.mark.slow

playwright_api = pytest.importorskip("playwright.sync_api")
WAIT_MS = 30_000


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with fleet(tmp_path_factory.mktemp("console")) as made:
        yield made


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    path = chromium_or_skip()
    with playwright_api.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    made = context.new_page()
    made.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    made.on("pageerror", lambda exc: errors.append(str(exc)))
    yield made
    context.close()
    assert not errors, errors  # no uncaught script error on any page


def sign_in(page: Any, rig: Fleet, token: str) -> None:
    page.goto(f"{rig.url}/console/")
    page.fill("#token", token)
    page.click("#signin button[type=submit]")
    page.wait_for_selector("#nav:not([hidden])")


def shoot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=False)


def test_sign_in_refuses_a_wrong_token_and_keeps_the_token_out_of_urls_and_cookies(
    page: Any, rig: Fleet
) -> None:
    page.goto(f"{rig.url}/console/")
    page.wait_for_selector("#signin")
    assert not page.locator("#nav").is_visible(), "no navigation before sign-in"
    page.fill("#token", "not-a-token-000")
    page.click("#signin button[type=submit]")
    page.wait_for_selector("#signin-error:has-text('not valid')")
    shoot(page, "sign-in")
    sign_in(page, rig, ALPHA)
    assert page.inner_text("#role") == "alpha"
    assert page.locator("#nav a[data-view=threads]").is_visible()
    assert page.evaluate("sessionStorage.getItem('wakeful.console.token')") == ALPHA
    assert page.context.cookies() == []
    assert ALPHA not in page.url


def test_submit_a_run_and_see_it_complete(page: Any, rig: Fleet) -> None:
    rig.model.push(Reply(events=openai_text("Hello ", "from ", "the ", "console.")))
    if not any(w.poll() is None for w in rig.workers):
        rig.worker("w1")
    sign_in(page, rig, ALPHA)
    page.fill("#new-thread", "console-hello")
    page.fill("#new-target", "chat")
    page.wait_for_selector("#new-input[data-kind=agent][placeholder=Hello]")
    page.fill("#new-input", "Say hello")  # plain text: the user message as typed
    page.click("#new-run button[type=submit]")
    page.wait_for_url(re.compile(r"#/threads/console-hello$"))
    page.wait_for_selector("#thread-status .s-completed")
    page.wait_for_selector(".msg.r-assistant:has-text('Hello from the console.')")
    page.wait_for_selector("#timeline li[data-type='run.completed']")
    page.wait_for_selector("#runs tr .s-completed")
    assert page.inner_text(".msg.r-user .text") == "Say hello"
    shoot(page, "thread")


def test_the_submit_form_takes_json_for_a_graph_with_a_placeholder_from_its_schema(
    page: Any, rig: Fleet
) -> None:
    sign_in(page, rig, ALPHA)
    page.fill("#new-thread", "console-form")
    page.fill("#new-target", "sorter")
    page.wait_for_selector("#new-input[data-kind=graph]")
    placeholder = page.get_attribute("#new-input", "placeholder")
    assert json.loads(str(placeholder)) == {"numbers": [], "total": 0}
    page.fill("#new-input", "sort these")
    page.click("#new-run button[type=submit]")
    page.wait_for_selector("#banner:has-text('The input of graph sorter is JSON')")
    assert with_store(rig, lambda store: store.list_dispatches(thread_id="console-form")) == []
    page.fill("#new-input", '{"numbers": [2, 1]}')
    page.click("#new-run button[type=submit]")
    page.wait_for_url(re.compile(r"#/threads/console-form$"))
    [d] = with_store(rig, lambda store: store.list_dispatches(thread_id="console-form"))
    assert d.payload["input"] == {"numbers": [2, 1]}


def test_an_event_of_an_unexpected_shape_shows_as_it_is_and_the_stream_stays(
    page: Any, rig: Fleet
) -> None:
    odd = {"plans": "R1", "note": "not a list"}
    with_store(rig, lambda store: commit_events(store, "console-odd", [("model.recovered", odd)]))
    sign_in(page, rig, ALPHA)
    page.goto(f"{rig.url}/console/#/threads/console-odd")
    row = page.locator("#timeline li[data-type='model.recovered']")
    row.wait_for()
    assert json.loads(row.locator(".data").inner_text()) == odd
    page.wait_for_selector("#live-state.l-live")
    with_store(rig, lambda store: commit_events(store, "console-odd", [("step", {"n": 1})]))
    page.locator("#timeline li[data-type='step']").wait_for()
    assert page.locator("#live-state").get_attribute("class") == "link-state l-live"


async def commit_events(store: Any, thread_id: str, events: list[tuple[str, Any]]) -> None:
    """Commit ``events`` to the thread of tenant alpha (no checkpoint), as a producer the
    console does not know would."""
    claim = await store.claim(thread_id, "seeder", 30)
    if await store.read(thread_id) is None or not (await store.read(thread_id)).tenant_bound:
        checkpoint = Checkpoint(
            id=f"{thread_id}-c1", parent=None, run_id="run-odd", status="running",
            state={}, created_at=datetime.now(UTC), tenant="alpha",
        )  # fmt: skip
    else:
        checkpoint = None
    drafts = tuple(EventDraft(type=t, data=d, run_id="run-odd") for t, d in events)
    await store.commit(thread_id, Commit(token=claim.token, checkpoint=checkpoint, events=drafts))
    await store.release(thread_id, claim.token)


def streams_route(rig: Fleet) -> bool:
    """Whether the server has the thread stream of issue 19 (``messages`` mode)."""
    with rig.api() as api:
        paths = api.get("/openapi.json").json()["paths"]
    return "/v1/threads/{thread_id}/stream" in paths


def running_worker(rig: Fleet) -> None:
    if not any(w.poll() is None for w in rig.workers):
        rig.worker(f"w{len(rig.workers) + 1}")


def submit(rig: Fleet, thread_id: str, target: str, value: Any, token: str = ALPHA) -> str:
    with rig.api(token) as api:
        r = api.post(f"/v1/threads/{thread_id}/runs", json={"target": target, "input": value})
        assert r.status_code == 202, r.text
        return str(r.json()["run_id"])


def test_reply_streams_live_before_the_run_completes(page: Any, rig: Fleet) -> None:
    if not streams_route(rig):
        pytest.skip("needs GET /v1/threads/{id}/stream (issue 19); the console falls back")
    words = [f"word{i} " for i in range(12)]
    rig.model.push(Reply(events=openai_text(*words), pace=0.4))
    running_worker(rig)
    sign_in(page, rig, ALPHA)
    submit(rig, "console-live", "chat", "Talk slowly")
    page.goto(f"{rig.url}/console/#/threads/console-live")
    page.wait_for_selector("#live-text:has-text('word1 ')")
    assert page.inner_text("#thread-status") == "running"  # the reply is still being written
    shoot(page, "thread-live")
    page.wait_for_selector("#thread-status .s-completed")
    page.wait_for_selector(f".msg.r-assistant:has-text('{''.join(words).strip()}')")
    assert page.locator(".msg.live").count() == 0


def test_worker_killed_mid_reply_recovery_is_marked_and_the_reply_finishes(
    page: Any, rig: Fleet
) -> None:
    for w in rig.workers:
        if w.poll() is None:
            w.send_signal(signal.SIGKILL)
            w.wait()
    before = len(rig.model.received)
    parts = ["Once ", "upon ", "a ", "time, "]
    rig.model.push(
        Reply(events=openai_text(*parts), pace=0.3, stall_after=len(parts) + 1),
        Reply(events=openai_text("happily ", "ever ", "after.")),
    )
    first = rig.worker("doomed")
    sign_in(page, rig, ALPHA)
    run_id = submit(rig, "console-crash", "chat", "Tell a story")
    page.goto(f"{rig.url}/console/#/threads/console-crash")
    page.wait_for_selector("#thread-status .s-running")
    wait_until(lambda: len(rig.model.received) > before, "the model request")
    # the worker saved what it has of the reply (the stream checkpoint) before it dies
    wait_until(lambda: saved_text(rig, run_id).startswith("Once upon"), "a stream checkpoint")
    first.send_signal(signal.SIGKILL)
    first.wait()
    rig.worker("rescuer")
    page.wait_for_selector("#thread-status .s-completed", timeout=60_000)
    continuation = rig.model.received[-1].body["messages"]
    partial = continuation[-2]["content"]  # what the recovered run asked the model to continue
    assert partial.startswith("Once upon")
    expected = partial + "happily ever after."
    page.wait_for_selector(f".msg.r-assistant .text:text-is('{expected}')")
    row = page.locator(f"#runs tr[data-run='{run_id}']")
    row.locator(".mark.m-takeover").wait_for()
    row.locator(".mark.m-R1").wait_for()
    page.locator("#timeline li[data-type='run.recovered']").wait_for()
    shoot(page, "thread-recovered")


def saved_text(rig: Fleet, run_id: str) -> str:
    async def read(store: Any) -> str:
        saved = await store.stream_checkpoints.get(run_id)
        return saved.partial_text if saved is not None else ""

    return str(with_store(rig, read))


def test_approving_a_ticket_continues_the_run(page: Any, rig: Fleet) -> None:
    rig.model.tool_arguments["ship"] = {"order": 7}
    running_worker(rig)
    sign_in(page, rig, ALPHA)
    submit(rig, "console-ship", "shipper", "Ship order 7")
    page.goto(f"{rig.url}/console/#/threads/console-ship")
    page.wait_for_selector("#thread-status .s-suspended")
    ticket = page.locator("#tickets form.ticket")
    ticket.locator("text=Run tool ship").wait_for()
    shoot(page, "thread-ticket")
    ticket.locator("button.approve").click()
    page.wait_for_selector("#tickets [data-answered]")
    page.wait_for_selector("#thread-status .s-completed")
    page.wait_for_selector(".msg.r-tool:has-text('order 7 shipped')")
    page.wait_for_selector(".msg.r-assistant:has-text('Done: order 7 shipped')")
    page.locator("#timeline li[data-type='run.resumed']").wait_for()


def test_checkpoint_state_and_diff(page: Any, rig: Fleet) -> None:
    running_worker(rig)
    sign_in(page, rig, ALPHA)
    submit(rig, "console-sort", "sorter", {"numbers": [3, 1, 2]})
    page.goto(f"{rig.url}/console/#/threads/console-sort")
    page.wait_for_selector("#thread-status .s-completed")
    page.wait_for_selector("#checkpoint-state:has-text('\"total\": 6')")
    rows = page.locator("#checkpoints tr[data-checkpoint]")
    assert rows.count() >= 3
    rows.last.locator("input[name=cp-a]").check()  # the first checkpoint: the input
    rows.first.locator("input[name=cp-b]").check()  # the last: sorted, with a total
    diff = page.locator("#checkpoint-diff")
    diff.locator("li.d-added:has-text('$.total')").wait_for()
    diff.locator("li.d-changed:has-text('$.numbers[0]')").wait_for()
    shoot(page, "checkpoint-diff")


def test_a_parent_links_to_its_child_run_and_back(page: Any, rig: Fleet) -> None:
    running_worker(rig)
    sign_in(page, rig, ALPHA)
    submit(rig, "console-lead", "lead", {"numbers": [5, 4]})
    page.goto(f"{rig.url}/console/#/threads/console-lead")
    page.wait_for_selector("#thread-status .s-completed")
    row = page.locator("#children tr[data-child]")
    row.locator(".s-completed").wait_for()
    assert row.locator("td").nth(1).inner_text() == "sorter"
    child = row.get_attribute("data-child")
    assert child is not None and child.startswith("console-lead:lead:")
    row.locator("a").click()
    page.wait_for_url(re.compile(r"#/threads/console-lead%3Alead%3A|#/threads/console-lead:lead:"))
    page.wait_for_selector("#parent-link a:has-text('console-lead')")
    page.wait_for_selector("#thread-status .s-completed")
    page.click("#parent-link a")
    page.wait_for_selector("#children tr[data-child]")


def test_quarantine_then_requeue_a_dispatch(page: Any, rig: Fleet) -> None:
    for w in rig.workers:  # no worker may take the exhausted work before the operator does
        if w.poll() is None:
            w.send_signal(signal.SIGTERM)
            w.wait(timeout=30)

    async def exhaust(store: Any) -> None:
        from tests.server_support import exhausted_dispatch

        await exhausted_dispatch(store, "d-console-stuck", "console-stuck")

    with_store(rig, exhaust)
    sign_in(page, rig, OPERATOR)
    page.goto(f"{rig.url}/console/#/queue")
    page.click("#queue-tabs [data-status=pending]")
    row = page.locator("tr[data-dispatch='d-console-stuck']")
    row.locator("text=2/1").wait_for()  # attempts past the budget
    row.locator("text=boom").wait_for()  # the last error
    row.locator("[data-action=quarantine]").click()
    page.click("[data-testid=confirm-ok]")
    page.click("#queue-tabs [data-status=quarantined]")
    page.wait_for_selector("[data-count=quarantined]:text-is('1')")
    row.locator("[data-action=inspect]").click()
    page.wait_for_selector("#inspection:has-text('d-console-stuck')")
    shoot(page, "queue")
    row.locator("[data-action=requeue]").click()
    page.click("[data-testid=confirm-ok]")
    page.wait_for_selector("[data-count=quarantined]:text-is('0')")
    page.click("#queue-tabs [data-status=pending]")
    row.locator("text=0/1").wait_for()  # pending again with a fresh budget

    async def status(store: Any) -> str:
        d = await store.get_dispatch("d-console-stuck")
        return str(d.status) if d is not None else "gone"

    assert with_store(rig, status) == "pending"
    page.click("#queue-tabs [data-status=pending]")
    assert row.locator("[data-action=quarantine]").count() == 0  # a fresh budget
    with_store(rig, purge_stuck)


async def purge_stuck(store: Any) -> None:
    [lease] = await store.claim_next("cleaner", 30)
    from wakeful.records import Done

    await store.settle(lease.dispatch.dispatch_id, lease.claim.token, Done())


def test_operator_sees_the_fleets_versions(page: Any, rig: Fleet) -> None:
    running_worker(rig)

    def versions() -> set[str]:
        with rig.api() as api:
            return {w["version"] for w in api.get("/v1/workers").json()["workers"]} - {None}

    # the rig's workers name none: the hash of the app's code
    (old,) = wait_until(versions, "a registered worker")
    new = rig.worker("w-v2", "--version", "console-v2")
    sign_in(page, rig, OPERATOR)
    page.goto(f"{rig.url}/console/#/workers")
    # console-v2 arrived last: it takes the starts; the code version drains
    page.locator("tr[data-version='console-v2'] .s-newest").wait_for()
    page.locator("tr[data-version='console-v2'] td[data-live='1']").wait_for()
    page.locator(f"tr[data-version='{old}'] .s-draining").wait_for()
    with rig.api() as api:
        listed = {v["version"]: v for v in api.get("/v1/versions").json()["versions"]}
    assert listed["console-v2"]["newest"] and not listed[old]["newest"]
    pinned = page.locator(f"tr[data-version='{old}'] td[data-pinned]").get_attribute("data-pinned")
    assert pinned is not None and int(pinned) >= 0
    shoot(page, "versions")
    new.send_signal(signal.SIGTERM)
    assert new.wait(timeout=30) == 0
    rig.workers.remove(new)  # stopped: the later tests' "last worker" is a rig worker
    # alone again, the code version takes the starts; console-v2 is gone
    page.locator(f"tr[data-version='{old}'] .s-newest").wait_for()
    page.locator("tr[data-version='console-v2'] .s-gone").wait_for()


def test_operator_views_workers_and_overview(page: Any, rig: Fleet) -> None:
    running_worker(rig)
    sign_in(page, rig, OPERATOR)
    page.goto(f"{rig.url}/console/#/threads")
    for thread in ("console-hello", "console-crash", "console-ship"):
        page.locator(f"tr[data-thread='{thread}']").wait_for()
    shoot(page, "threads")
    page.fill("#search", "console-s")
    page.click("#thread-search button")
    # The rows of the previous listing stay until the new page is drawn: wait for the new
    # page's rows, not for a row that both listings hold.
    rows = page.locator("tr[data-thread]")
    wait_until(lambda: rows.count() == 2, "the two console-s threads")
    page.locator("tr[data-thread='console-ship']").wait_for()
    page.locator("tr[data-thread='console-sort']").wait_for()
    page.select_option("#status-filter", "completed")
    page.fill("#target-filter", "sorter")
    page.click("#thread-search button")
    page.wait_for_url(re.compile(r"target=sorter"))
    wait_until(lambda: rows.count() == 1, "only the completed sorter thread")
    page.locator("tr[data-thread='console-sort']").wait_for()
    page.goto(f"{rig.url}/console/#/workers")
    live = rig.workers[-1]
    assert live.poll() is None
    page.fill("#live-within", "5")  # the test's workers beat every 2/3 s (ttl 2 s)
    page.dispatch_event("#live-within", "change")
    args = cast(list[str], live.args)
    stopped = args[args.index("--worker-id") + 1]
    # This worker's own row, not any live one: a worker SIGKILLed by an earlier test still
    # looks live for a few seconds, and a SIGTERM before this one has started would kill it.
    page.locator(f"tr[data-worker='{stopped}'] .s-live").wait_for()
    page.locator("tr[data-worker='doomed'] .s-expired").wait_for()
    shoot(page, "workers")
    for w in rig.workers:
        if w.poll() is None:
            w.send_signal(signal.SIGTERM)
            assert w.wait(timeout=30) == 0, f"a worker did not stop gracefully: {w.args!r}"
    # a graceful stop is recorded: the view shows it stopped, not expired, on its next load
    page.locator(f"tr[data-worker='{stopped}'] .s-stopped").wait_for()
    assert page.locator("tr[data-worker='doomed'] .s-expired").count() == 1
    page.goto(f"{rig.url}/console/#/overview")
    page.locator("[data-figure=pending] b").wait_for()
    for i in range(12):  # a backlog the figures show, then see drain
        submit(rig, f"console-batch-{i:02}", "sorter", {"numbers": [i, 1]})
    page.locator("[data-figure=pending] b:text-is('12')").wait_for()
    rig.worker("drainer")
    page.locator("[data-figure=pending] b:text-is('0')").wait_for()
    line = page.locator("#depth-chart polyline[data-series=pending]")
    wait_until(lambda: len((line.get_attribute("points") or "").split()) >= 3, "three samples")
    shoot(page, "overview")


def test_a_tenant_sees_neither_other_tenants_threads_nor_operator_views(
    page: Any, rig: Fleet
) -> None:
    sign_in(page, rig, BETA)
    assert page.inner_text("#role") == "beta"
    page.goto(f"{rig.url}/console/#/threads")
    page.wait_for_selector("#no-threads")
    assert page.locator("tr[data-thread]").count() == 0
    for view in ("queue", "workers", "overview"):
        assert not page.locator(f"#nav a[data-view={view}]").is_visible()
    page.goto(f"{rig.url}/console/#/queue")
    page.wait_for_selector("#forbidden")
    page.goto(f"{rig.url}/console/#/threads/console-hello")
    page.wait_for_selector("#banner:has-text('404')")
    assert page.locator(".msg").count() == 0
    # the expired-token path: the server no longer knows the token, the page asks again
    page.evaluate("sessionStorage.setItem('wakeful.console.token', 'revoked-token-000')")
    page.goto(f"{rig.url}/console/#/threads")
    page.reload()
    page.wait_for_selector("#signin")


def test_cancel_a_running_run(page: Any, rig: Fleet) -> None:
    running_worker(rig)
    rig.model.push(Reply(events=openai_text(*[f"w{i} " for i in range(40)]), pace=0.25))
    sign_in(page, rig, ALPHA)
    submit(rig, "console-cancel", "chat", "Talk for a while")
    page.goto(f"{rig.url}/console/#/threads/console-cancel")
    page.wait_for_selector("#thread-status .s-running")
    page.click("#cancel-run")
    assert page.inner_text("[data-testid=confirm-keep]") == "Keep running"
    assert page.inner_text("[data-testid=confirm-ok]") == "Cancel run"
    page.click("[data-testid=confirm-ok]")
    page.wait_for_selector("#cancel-sent")
    page.wait_for_selector("#thread-status .s-cancelled")
    page.locator("#timeline li[data-type='run.cancelled']").wait_for()


def test_a_run_delayed_from_the_form_waits_with_its_time(page: Any, rig: Fleet) -> None:
    sign_in(page, rig, ALPHA)
    page.fill("#new-start", "soon")  # neither a delay nor an instant: refused, nothing sent
    page.fill("#new-thread", "console-later")
    page.fill("#new-target", "chat")
    page.fill("#new-input", "Remind me tomorrow")
    page.click("#new-run button[type=submit]")
    page.wait_for_selector("text=Start is a delay")
    with rig.api() as api:  # nothing was submitted: the thread does not exist
        assert api.get("/v1/threads/console-later").status_code == 404
    page.fill("#new-start", "1d")
    page.click("#new-run button[type=submit]")
    page.wait_for_url(re.compile(r"#/threads/console-later$"))
    waiting = page.locator("#waiting tr .waiting-what")
    waiting.wait_for()
    assert waiting.inner_text().startswith("scheduled: not before ")
    with rig.api() as api:
        [d] = api.get("/v1/dispatches", params={"thread_id": "console-later"}).json()["dispatches"]
    assert d["status"] == "scheduled" and d["not_before"] is not None
    delay = datetime.fromisoformat(d["not_before"]) - datetime.fromisoformat(d["created_at"])
    assert abs(delay.total_seconds() - 86400) < 1
    assert d["not_before"][:10] in waiting.inner_text()


def test_a_sleeping_run_shows_sleeping_until_its_wake_time(page: Any, rig: Fleet) -> None:
    wake = datetime(2999, 1, 1, 9, 0, tzinfo=UTC)  # nothing wakes it during the test
    with_store(rig, lambda store: commit_sleep(store, "console-asleep", wake))
    sign_in(page, rig, ALPHA)
    page.goto(f"{rig.url}/console/#/threads/console-asleep")
    page.wait_for_selector("#thread-status .s-sleeping")
    assert "2999" in page.inner_text("#wake-at")
    row = page.locator("#runs tr[data-run='run-asleep']")
    row.wait_for()
    assert "sleeping" in row.inner_text() and "2999" in row.locator(".wake-at").inner_text()
    assert page.is_enabled("#cancel-run")  # a cancel ends a sleeping run


async def commit_sleep(store: Any, thread_id: str, wake: datetime) -> None:
    """Commit what ``ctx.sleep`` records (a sleep ticket and the wake time) for tenant
    alpha, and release the claim, as a sleeping run leaves its thread."""
    claim = await store.claim(thread_id, "seeder", 30, tenant="alpha")
    ticket = {
        "id": "t0-s1",
        "task_id": "t0",
        "node": "nap",
        "question": {"sleep_until": wake.isoformat()},
        "schema": "wakeful.sleep",
    }
    checkpoint = Checkpoint(
        id=f"{thread_id}-c1", parent=None, run_id="run-asleep", status="suspended",
        state={}, created_at=datetime.now(UTC), tenant="alpha",
        metadata={"wake_at": wake.isoformat(), "tickets": [ticket]},
    )  # fmt: skip
    await store.commit(thread_id, Commit(token=claim.token, checkpoint=checkpoint, release=True))


def test_schedules_pause_resume_run_now_and_delete(page: Any, rig: Fleet) -> None:
    body = {"target": "sorter", "cron": "0 3 * * *", "thread": "console-nightly"}
    with rig.api(ALPHA) as api:
        r = api.put("/v1/schedules/nightly", json=body)
        assert r.status_code == 200, r.text
    sign_in(page, rig, ALPHA)
    page.goto(f"{rig.url}/console/#/schedules")
    row = "tr[data-schedule='nightly']"
    page.locator(f"{row} .s-active").wait_for()
    page.click(f"{row} [data-action=pause]")
    page.locator(f"{row} .s-paused").wait_for()
    page.click(f"{row} [data-action=resume]")
    page.locator(f"{row} .s-active").wait_for()
    page.click(f"{row} [data-action=trigger]")
    page.locator(f"{row} td[data-fired='1']").wait_for()
    shoot(page, "schedules")
    page.click(f"{row} [data-action=delete]")
    page.click("[data-testid=confirm-ok]")
    page.wait_for_selector(row, state="detached")
    with rig.api(ALPHA) as api:
        assert api.get("/v1/schedules/nightly").status_code == 404
        fired = api.get("/v1/dispatches", params={"thread_id": "console-nightly"}).json()
    assert [d["dispatch_id"].split(":")[2] for d in fired["dispatches"]] == ["trigger"]


def test_the_limits_panel_shows_a_blocked_key_and_the_run_waiting_for_it(
    page: Any, rig: Fleet
) -> None:
    # a 429 blocked the key for ten minutes: the run's model call waits (and never reaches
    # the model server, whose scripted replies the other tests use)
    with_store(rig, lambda store: store.block_limit("console:limited", 600))
    running_worker(rig)
    run_id = submit(rig, "console-limited", "limited", "Hello")
    sign_in(page, rig, ALPHA)
    page.click("#nav a[data-view=limits]")
    row = "#rate-limits tr[data-key='console:limited']"
    page.locator(f"{row}[data-waiting='1'] a.chip:has-text('console-limited')").wait_for()
    assert page.locator(f"{row} .s-blocked").count() == 1
    assert "of 1.0 (60/min)" in page.inner_text(row)
    assert page.get_attribute(f"{row} a.chip", "title").startswith(run_id)
    page.locator("#concurrency-keys:has-text('No concurrency key is in use')").wait_for()
    shoot(page, "limits")
    # another tenant sees the key, not the run
    page.click("#signout")
    sign_in(page, rig, BETA)
    page.goto(f"{rig.url}/console/#/limits")
    page.locator(f"{row}[data-waiting='0']").wait_for()
    assert page.locator(f"{row} a.chip").count() == 0
    # the run must end here: a worker waits for its runs when it stops
    with rig.api(ALPHA) as api:
        r = api.post("/v1/threads/console-limited/cancel", json={"reason": "test over"})
        assert r.status_code in (200, 202), r.text
        wait_until(
            lambda: api.get("/v1/threads/console-limited").json().get("status") == "cancelled",
            "the waiting run cancelled",
        )


def test_history_shows_branches_and_edit_state_then_replay_runs_on(page: Any, rig: Fleet) -> None:
    running_worker(rig)
    sign_in(page, rig, ALPHA)
    submit(rig, "console-travel", "sorter", {"numbers": [3, 1, 2]})
    page.goto(f"{rig.url}/console/#/threads/console-travel")
    page.wait_for_selector("#thread-status .s-completed")
    rows = page.locator("#history li[data-checkpoint]")
    page.wait_for_selector("#history li[data-where=head]")
    assert rows.count() == 3 and page.locator("#history li.abandoned").count() == 0
    after_sort = page.locator("#history li[data-checkpoint]:has(.nodes:text-matches('sort$'))")
    after_sort.locator("button[data-action=edit-state]").click()
    dialog = page.locator("#edit-state-dialog")
    assert json.loads(dialog.locator("textarea[name=state]").input_value()) == {
        "numbers": [1, 2, 3]
    }
    assert dialog.locator("input[name=as_node]").input_value() == "sort"
    dialog.locator("[data-testid=ask-ok]").click()
    dialog.locator("[data-testid=ask-error]:has-text('Nothing changed')").wait_for()
    dialog.locator("textarea[name=state]").fill('{"numbers": [10, 20]}')
    shoot(page, "thread-edit-state")
    dialog.locator("[data-testid=ask-ok]").click()
    page.wait_for_selector("#history-notice:has-text('next sum')")
    page.wait_for_selector("#history li.abandoned")  # the old `sum` is off the head's line
    head = page.locator("#history li[data-where=head]")
    assert head.get_attribute("data-branch") == "1"
    head.locator("button[data-action=replay]").click()
    page.click("[data-testid=confirm-ok]")
    page.wait_for_selector("#history-notice:has-text('Replay queued')")
    page.wait_for_selector("#thread-status .s-completed")
    page.wait_for_selector("#history li[data-where=head] .nodes:text-matches('sum$')")
    snap = with_store(rig, lambda store: store.read("console-travel"))
    assert snap.checkpoint.state == {"numbers": [10, 20], "total": 30}
    assert page.locator("#history li.fork-note").count() == 1
    page.locator("#history-panel").evaluate("n => n.parentElement.scrollIntoView()")
    shoot(page, "thread-history")


def test_edit_a_user_message_in_the_conversation(page: Any, rig: Fleet) -> None:
    running_worker(rig)
    rig.model.push(Reply(events=openai_text("Paris.")))
    sign_in(page, rig, ALPHA)
    submit(rig, "console-edit", "chat", "Capital of France?")
    page.goto(f"{rig.url}/console/#/threads/console-edit")
    page.wait_for_selector(".msg.r-assistant:has-text('Paris.')")
    rig.model.push(Reply(events=openai_text("Rome.")))
    page.click(".msg.r-user button[data-action=edit-message]")
    page.locator("#edit-message-dialog textarea[name=content]").fill("Capital of Italy?")
    page.click("#edit-message-dialog [data-testid=ask-ok]")
    page.wait_for_selector(".msg.r-assistant:has-text('Rome.')")
    assert page.inner_text(".msg.r-user .text") == "Capital of Italy?"
    assert page.locator(".msg.r-assistant").count() == 1
    page.wait_for_selector("#history li.abandoned")  # the first answer, still readable
    shoot(page, "thread-edit")


def test_the_thread_shows_queued_and_coalesced_submissions(page: Any, rig: Fleet) -> None:
    for w in rig.workers:  # the submissions must stay as the store left them
        if w.poll() is None:
            w.send_signal(signal.SIGTERM)
            w.wait(timeout=30)
    with_store(rig, busy_thread)
    sign_in(page, rig, ALPHA)
    assert page.input_value("#new-if-busy") == "enqueue"  # the default
    page.fill("#new-thread", "console-busy")
    page.fill("#new-target", "chat")
    page.wait_for_selector("#new-input[data-kind=agent]")
    page.fill("#new-input", "and one more thing")
    page.select_option("#new-if-busy", "coalesce")
    page.click("#new-run button[type=submit]")
    page.wait_for_url(re.compile(r"#/threads/console-busy$"))
    waiting = page.locator("#waiting")
    waiting.wait_for()
    queued = waiting.locator("tr:has(.s-queued)")
    queued.wait_for()
    assert queued.locator(".waiting-what").inner_text() == "waits behind cb-c1"
    assert "coalesce" in queued.inner_text()
    for name in ("cb-c2", "cb-c3"):
        row = waiting.locator(f"tr[data-dispatch='{name}']")
        assert row.locator(".waiting-what").inner_text() == (
            "coalesced: answered by run-cb-c1 (cb-c1)"
        )
        assert "coalesce" in row.inner_text()
    head = waiting.locator("tr[data-dispatch='cb-c1'] .waiting-what")
    assert head.inner_text() == "its run run-cb-c1 also answers cb-c2, cb-c3"
    assert waiting.locator("tr[data-dispatch='cb-1']").count() == 0, "it ran: not waiting"
    shoot(page, "thread-waiting")
    with_store(rig, drain_busy_thread)


def _busy_dispatch(dispatch_id: str, if_busy: Any) -> Any:
    from wakeful.records import Dispatch

    return Dispatch(
        dispatch_id=dispatch_id, thread_id="console-busy", kind="start", tenant="alpha",
        payload={"target": "chat", "input": "hi", "run_id": f"run-{dispatch_id}"},
        if_busy=if_busy,
    )  # fmt: skip


async def busy_thread(store: Any) -> None:
    """Thread ``console-busy``: a run that ends while three ``coalesce`` submissions wait,
    so the first of them runs for all three (and holds the thread)."""
    from wakeful.records import Done

    await commit_events(store, "console-busy", [("note", {"n": 1})])
    await store.enqueue(_busy_dispatch("cb-1", "enqueue"))
    for name in ("cb-c1", "cb-c2", "cb-c3"):
        await store.enqueue(_busy_dispatch(name, "coalesce"))
    [lease] = await store.claim_next("seeder", 30, thread_id="console-busy")
    await store.settle("cb-1", lease.claim.token, Done())


async def drain_busy_thread(store: Any) -> None:
    """Settle what ``busy_thread`` left open, so no later worker runs it."""
    from wakeful.records import Done

    for _ in range(2):  # cb-c1, then the form's submission (admitted when cb-c1 settles)
        [lease] = await store.claim_next("cleaner", 30, thread_id="console-busy")
        await store.settle(lease.dispatch.dispatch_id, lease.claim.token, Done())


def test_history_shows_what_ran_inside_a_subgraph(page: Any, rig: Fleet) -> None:
    running_worker(rig)
    sign_in(page, rig, ALPHA)
    submit(rig, "console-nested", "nested", {"numbers": [2, 9, 1]})
    page.goto(f"{rig.url}/console/#/threads/console-nested")
    page.wait_for_selector("#thread-status .s-completed")
    nested = page.locator("#history li[data-checkpoint] [data-subgraph=inner]")
    nested.first.wait_for()
    # the step of the subgraph node names the subgraph and its supersteps in order
    assert "inner (sorter): sort → sum" in nested.first.inner_text()
