"""Webhook URLs and signatures (issue 43): URLs are validated without echoing a secret,
signatures follow the Standard Webhooks scheme (its example vector), and the receiver
example of docs/composition.md verifies and deduplicates."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

from wakeful.errors import InvalidInput
from wakeful.fleet import Registry
from wakeful.fleet.webhook_signing import check_webhook_url, new_secret, redact_url, sign, verify
from wakeful.runtime import START, Graph, append

SECRET = new_secret()


class State(TypedDict):
    log: Annotated[list[str], append]


def echo(state: dict[str, Any]) -> dict[str, Any]:
    return {"log": ["echoed"]}


def test_webhook_urls_are_validated_without_echoing_credentials() -> None:
    assert check_webhook_url("https://example.com/h?x=1") == "https://example.com/h?x=1"
    for bad in ("ftp://example.com/", "https://", "https://u:hunter2@example.com/", "x" * 3000,
                "https://example.com/#frag", "https://exa mple.com/", 7):  # fmt: skip
        with pytest.raises(InvalidInput) as refused:
            check_webhook_url(bad)
        assert "hunter2" not in str(refused.value)
    with pytest.raises(InvalidInput):
        Registry().add("t", Graph(State, name="g").node("e", echo).edge(START, "e").compile(),
                       webhook="https://u:p@example.com/")  # fmt: skip


def test_a_receiver_example_in_the_docs_verifies_a_signature() -> None:
    """The Standard Webhooks example vector: a receiver's check of a known signature."""
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    headers = {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
    }
    body = b'{"test": 2432232314}'
    assert verify(secret, headers, body, now=1614265330)
    assert not verify(secret, headers, body, now=1614265330 + 301), "too old"
    assert not verify(secret, headers, body + b" ", now=1614265330)


def test_the_receiver_example_of_the_docs_verifies_and_deduplicates() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "composition.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "def receive(" in b]
    scope: dict[str, Any] = {}
    exec(block.replace('"whsec_..."', repr(SECRET)), scope)
    body = b'{"type": "run.completed", "data": {"thread_id": "t1", "output": "ok"}}'
    headers = sign((SECRET,), "msg_1", int(time.time()), body)
    assert scope["receive"](headers, body) == 200
    assert scope["seen"] == {"msg_1"}
    assert scope["receive"](headers, body) == 200, "a repeat is acknowledged"
    assert scope["receive"](headers, body + b" ") == 401
    assert scope["receive"](sign((new_secret(),), "msg_2", int(time.time()), body), body) == 401
    assert scope["receive"](sign((SECRET,), "msg_3", int(time.time()) - 900, body), body) == 400


def test_redacted_urls_lose_their_query_string() -> None:
    assert redact_url("https://h.example:8443/p/q?token=s3cret") == "https://h.example:8443/p/q?…"
    assert redact_url("http://[::1]/x") == "http://[::1]/x"
    assert redact_url("http://h:99999/") == "(not a valid URL)"
