"""The console's Webhooks view end to end (issue 43): ``wakeful serve`` and a ``wakeful
worker`` (with ``--allow-private-webhooks`` and the secret from ``WAKEFUL_WEBHOOK_SECRET``)
over one SQLite store, two loopback receivers (one answers 200, one always 500), Debian's
Chromium driven by Playwright. The tenant sees its delivered and its failing webhook with
the error; another tenant sees neither."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli_support import ROOT, WAKEFUL
from tests.console_support import ALPHA, APP, BETA, CHROMIUM_ARGS, SHOTS, Fleet, fleet
from tests.webhook_support import receiver
from wakeful.fleet.webhook_signing import new_secret

pytestmark = pytest.mark.slow

playwright_api = pytest.importorskip("playwright.sync_api")
WAIT_MS = 30_000


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Fleet]:
    with fleet(tmp_path) as made:
        env = {**made.env(), "WAKEFUL_WEBHOOK_SECRET": new_secret()}
        args = ["worker", "--app", APP, "--ttl", "2", "--poll", "0.1", "--allow-private-webhooks"]
        made.workers.append(
            subprocess.Popen([WAKEFUL, *args], cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
        )
        yield made


@pytest.fixture
def browser() -> Iterator[Any]:
    from tests.console_support import chromium_or_skip

    path = chromium_or_skip()
    with playwright_api.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def test_the_webhooks_view_lists_a_tenants_deliveries_and_failures(
    browser: Any, rig: Fleet
) -> None:
    with receiver() as ok, receiver([500] * 100) as failing:
        with rig.api(ALPHA) as api:
            for thread, url in (("hook-ok", ok.url), ("hook-500", failing.url)):
                body = {"target": "sorter", "input": {"numbers": [3, 1]}, "webhook": url}
                answer = api.post(f"/v1/threads/{thread}/runs", json=body)
                assert answer.status_code == 202, answer.text
        context = browser.new_context(viewport={"width": 1360, "height": 900})
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{rig.url}/console/")
        page.fill("#token", ALPHA)
        page.click("#signin button[type=submit]")
        page.wait_for_selector("#nav:not([hidden])")
        page.click("#nav a[data-view=webhooks]")
        page.locator("tr[data-status=delivered]").wait_for()
        failed = page.locator("tr[data-status=pending]")
        failed.wait_for()
        assert "answered HTTP 500" in failed.inner_text()
        assert "hook-500" in failed.inner_text() and "hook-ok" not in failed.inner_text()
        assert "token=x" not in page.inner_text("#webhooks"), "query strings are not shown"
        page.locator("#webhook-counts:has-text('1 pending · 1 delivered · 0 dead')").wait_for()
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "webhooks.png"), full_page=False)
        assert ok.count() == 1 and failing.count() >= 1
        context.close()
        assert not errors, errors

        other = browser.new_context()
        page = other.new_page()
        page.set_default_timeout(WAIT_MS)
        page.goto(f"{rig.url}/console/")
        page.fill("#token", BETA)
        page.click("#signin button[type=submit]")
        page.wait_for_selector("#nav:not([hidden])")
        page.goto(f"{rig.url}/console/#/webhooks")
        page.locator("#webhooks:has-text('No webhook delivery')").wait_for()
        other.close()
