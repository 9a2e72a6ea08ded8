"""Bearer tokens, tenants and the operator role of the API: ``wakeful.fleet.tokens``, where
they live so the remote hand (a fleet service) takes tokens the same way."""

from __future__ import annotations

from wakeful.fleet.tokens import (
    DEV_CALLER,
    ENV_VAR,
    OPERATOR,
    Authenticator,
    Caller,
    load_tokens,
    parse_tokens,
)

__all__ = [
    "DEV_CALLER",
    "ENV_VAR",
    "OPERATOR",
    "Authenticator",
    "Caller",
    "load_tokens",
    "parse_tokens",
]
