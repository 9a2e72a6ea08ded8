"""The store conformance suite, shipped with wakeful so any store can run it.

Subclass ``StoreConformance`` in a test module, name the class ``Test...`` and implement
``new_store``; pytest (with pytest-asyncio and hypothesis, the ``testkit`` extra) then runs
every case against your store::

    from wakeful.testkit import StoreConformance

    class TestMyStore(StoreConformance):
        async def new_store(self, clock):
            return await open_my_store(fresh_location(), clock=clock)

Override ``reopen``, ``sibling``, ``advance_store_clock`` and ``exact_expiry`` to fit a
durable store, and declare ``capabilities`` (see ``CAPABILITIES``). See docs/testkit.md.
"""

from __future__ import annotations

from wakeful.testkit.branch_cases import BranchCases
from wakeful.testkit.busy_cases import BusyCases
from wakeful.testkit.claim_cases import ClaimCases
from wakeful.testkit.commit_cases import CommitCases
from wakeful.testkit.deploy_cases import DeployCases
from wakeful.testkit.drop_cases import DropCases
from wakeful.testkit.fold_cases import FoldCases
from wakeful.testkit.harness import CAPABILITIES, Harness, Kit
from wakeful.testkit.history_cases import HistoryCases
from wakeful.testkit.key_cases import FairCases, KeyCases
from wakeful.testkit.limit_cases import LimitCases
from wakeful.testkit.listing_cases import ListingCases
from wakeful.testkit.messaging_cases import MessagingCases
from wakeful.testkit.operation_cases import OperationCases
from wakeful.testkit.queue_cases import QueueCases
from wakeful.testkit.run_cases import RunCases
from wakeful.testkit.stateful import run_stateful
from wakeful.testkit.tenant_cases import TenantCases
from wakeful.testkit.time_cases import TimeCases
from wakeful.testkit.value_cases import ValueCases


class StatefulCases(Harness):
    stateful_examples = 40
    """How many random operation sequences the stateful case tries."""

    def test_random_operations_agree_with_the_reference_model(self) -> None:
        run_stateful(self, max_examples=self.stateful_examples)


class StoreConformance(
    BusyCases,
    CommitCases,
    DeployCases,
    BranchCases,
    HistoryCases,
    ClaimCases,
    KeyCases,
    FairCases,
    LimitCases,
    DropCases,
    FoldCases,
    QueueCases,
    RunCases,
    ListingCases,
    MessagingCases,
    OperationCases,
    TenantCases,
    TimeCases,
    ValueCases,
    StatefulCases,
):
    """Every conformance case. Subclass it with a ``Test`` name and implement ``new_store``."""


__all__ = [
    "CAPABILITIES",
    "BranchCases",
    "BusyCases",
    "ClaimCases",
    "CommitCases",
    "DeployCases",
    "DropCases",
    "FairCases",
    "FoldCases",
    "Harness",
    "HistoryCases",
    "KeyCases",
    "Kit",
    "LimitCases",
    "ListingCases",
    "MessagingCases",
    "OperationCases",
    "QueueCases",
    "RunCases",
    "StatefulCases",
    "StoreConformance",
    "TenantCases",
    "TimeCases",
    "ValueCases",
    "run_stateful",
]
