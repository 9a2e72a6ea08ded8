"""Concurrency keys (issue 39): at most ``limit`` runs of one key admitted at once, across
every worker on the store.

A dispatch carries ``concurrency_key`` and ``concurrency_limit`` (``Dispatch``); the store
admits at most ``limit`` dispatches of a key (``pending`` or ``leased``) and keeps the
others ``waiting_key``, outside the claim's index, until one of the admitted ones settles,
is suspended or is cancelled (decision 0035, "Slots"). ``Concurrency`` is the rule a target
is registered with (``Registry.add(name, app, concurrency={"key": "tenant", "limit": 5})``)
and that ``submit`` applies; ``KeyUse`` is what the store reports per key
(``ConcurrencyStore.concurrency_keys``, ``wakeful limits list``, ``/metrics``).

The forms of ``key``:

- ``"tenant"``: the submission's tenant (key ``tenant:<tenant>``); a submission without a
  tenant is not limited by the rule.
- ``"input.<field>"``: a top-level field of the run's input (key ``<field>:<value>``, the
  value as JSON text when it is not a string); an input without the field is not limited.
- anything else: that literal key, shared by every run of the target and by any other
  target or submission naming it (``"model:gpt-4o"``: one limit for a model).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from wakeful.errors import InvalidInput

MAX_CONCURRENCY_KEY = 200
"""The longest concurrency key, in characters."""


def check_concurrency_key(key: object) -> str:
    """A concurrency key: any text of 1 to ``MAX_CONCURRENCY_KEY`` characters without
    control characters (``tenant:acme``, ``model:gpt-4o``)."""
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_CONCURRENCY_KEY:
        raise InvalidInput("concurrency_key", f"must be 1 to {MAX_CONCURRENCY_KEY} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise InvalidInput("concurrency_key", "must not contain control characters")
    return key


class KeyUse(msgspec.Struct, frozen=True, kw_only=True):
    """One concurrency key as the store holds it: its limit (the latest enqueue's), how many
    of its dispatches are admitted (``pending`` or ``leased``, a lapsed lease included) and
    how many wait (``waiting_key``)."""

    key: str
    limit: int
    admitted: int
    waiting: int


class Concurrency(msgspec.Struct, frozen=True):
    """A target's concurrency rule: ``key`` (see the module's forms) and ``limit``."""

    key: str
    limit: int

    def __post_init__(self) -> None:
        if self.key not in ("tenant", "input."):
            check_concurrency_key(self.key)
        if self.key.startswith("input.") and len(self.key) == len("input."):
            raise InvalidInput("concurrency", "input. needs a field name: input.user")
        if isinstance(self.limit, bool) or not 1 <= self.limit < 2**31:
            raise InvalidInput("concurrency", "limit must be an integer from 1 to 2**31 - 1")

    def key_for(self, tenant: str | None, input: Any) -> str | None:
        """The key a submission of ``input`` for ``tenant`` takes, or ``None`` when the
        rule does not apply to it."""
        if self.key == "tenant":
            return None if tenant is None else check_concurrency_key(f"tenant:{tenant}")
        if self.key.startswith("input."):
            name = self.key[len("input.") :]
            if not isinstance(input, Mapping) or name not in input:
                return None
            value = input[name]
            text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
            return check_concurrency_key(f"{name}:{text}")
        return self.key


def concurrency_of(rule: Concurrency | Mapping[str, Any] | None) -> Concurrency | None:
    """``rule`` as a ``Concurrency``: one already, a mapping ``{"key": ..., "limit": ...}``,
    or ``None``."""
    if rule is None or isinstance(rule, Concurrency):
        return rule
    if not isinstance(rule, Mapping) or set(rule) != {"key", "limit"}:
        raise InvalidInput("concurrency", 'must be {"key": ..., "limit": ...}')
    key, limit = rule["key"], rule["limit"]
    if not isinstance(key, str) or not isinstance(limit, int):
        raise InvalidInput("concurrency", "key must be text and limit an integer")
    return Concurrency(key, limit)
