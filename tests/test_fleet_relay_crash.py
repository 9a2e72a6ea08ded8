"""A killed relay is replaced within seconds: ``wakeful relay`` processes SIGKILLed 10 times
during a 100-message exchange between two threads (a replacement started after each kill)
deliver every message once, with a delivery lag p99 below the documented bound; and the
relay's election claim is short by default."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.harness import Stores
from tests.chaos.relaytrial import LAG_BOUND, relay_replace
from tests.chaos.trials import Trial
from tests.cli_support import cli
from wakeful.fleet import NoWake, RelayLoop
from wakeful.fleet.relay import RELAY_TTL
from wakeful.runtime import ClaimPolicy
from wakeful.store.memory import MemoryStore


def test_the_relay_claim_is_short_by_default_and_renewed_every_quarter_ttl() -> None:
    store = MemoryStore()
    relay = RelayLoop(store, "r", ClaimPolicy(), NoWake())
    assert relay.ttl == RELAY_TTL <= 5
    assert relay.interval <= relay.ttl / 4
    short = RelayLoop(store, "r", ClaimPolicy(ttl=1.0, renew_every=0.3), NoWake())
    assert short.ttl == 1.0 and short.interval == 0.25
    assert RelayLoop(store, "r", ClaimPolicy(), NoWake(), ttl=8).ttl == 8


def test_the_relay_command_documents_its_ttl_default() -> None:
    done = cli("relay", "--help")
    assert done.returncode == 0
    assert f"[default: {RELAY_TTL};" in " ".join(done.stdout.split())


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_relay_killed_10_times_during_a_100_message_exchange(tmp_path: Path) -> None:
    stores = Stores()
    trial = Trial("relay_replace", "sqlite", 26, tmp_path)
    trial.url = stores.create("sqlite", tmp_path)
    relay_replace(trial, messages=100, kills=10)
    print(trial.notes)
    assert trial.notes["kills"] == 10
    assert trial.notes["messages"] == 100
    assert trial.violations == [], trial.violations
    assert trial.notes["lag_p99"] < LAG_BOUND
