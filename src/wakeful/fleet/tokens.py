"""Bearer tokens, tenants and the operator role (of the API, ``wakeful.server.auth``, and
of the remote hand, ``wakeful.fleet.handserver``).

A token maps to a tenant name. A token whose tenant is ``"*"`` is an *operator*: it may use
the operator routes and sees every tenant's threads. Tokens are loaded by ``load_tokens``
from a JSON file (``{"token": "tenant"}``) or from the environment variable
``WAKEFUL_TOKENS`` (``token1=tenant1,token2=tenant2``).

**No token configured at all is development mode**: every request, with or without an
``Authorization`` header, is tenant ``None`` *and* an operator. Never expose a server in
development mode beyond localhost.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from wakeful.errors import InvalidInput
from wakeful.ids import check_id

OPERATOR = "*"
ENV_VAR = "WAKEFUL_TOKENS"
MIN_TOKEN_LENGTH = 8


@dataclass(frozen=True)
class Caller:
    """Who is asking: a tenant (``None`` in development mode and for operators) and whether
    the caller has the operator role."""

    tenant: str | None
    operator: bool


DEV_CALLER = Caller(tenant=None, operator=True)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def _check_entry(token: object, tenant: object, where: str) -> tuple[str, str]:
    if not isinstance(token, str) or not isinstance(tenant, str):
        raise InvalidInput("tokens", f"{where}: tokens and tenants must be strings")
    if len(token) < MIN_TOKEN_LENGTH or any(c.isspace() or c in ",=" for c in token):
        # Never echo the token: it is a secret.
        raise InvalidInput(
            "tokens",
            f"{where}: a token must be at least {MIN_TOKEN_LENGTH} characters without "
            f"whitespace, ',' or '='",
        )
    if tenant != OPERATOR:
        check_id("tenant", tenant)
    return token, tenant


def parse_tokens(spec: str, variable: str = ENV_VAR) -> dict[str, str]:
    """Parse ``token1=tenant1,token2=tenant2`` (the ``WAKEFUL_TOKENS`` format; ``variable``
    names the source in errors)."""
    tokens: dict[str, str] = {}
    for i, item in enumerate(part.strip() for part in spec.split(",")):
        if not item:
            continue
        token, sep, tenant = item.partition("=")
        if not sep:
            raise InvalidInput("tokens", f"{variable} entry {i + 1} is not token=tenant")
        token, tenant = _check_entry(token.strip(), tenant.strip(), f"entry {i + 1}")
        tokens[token] = tenant
    return tokens


def load_tokens(
    path_or_env: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    variable: str = ENV_VAR,
) -> dict[str, str]:
    """The token table. ``path_or_env`` is the path of a JSON file ``{"token": "tenant"}``;
    ``None`` reads the environment variable ``variable`` (``WAKEFUL_TOKENS``; the remote
    hand's is ``WAKEFUL_HAND_TOKENS``) from ``environ`` (default ``os.environ``). An empty
    result means development mode (see the module docstring)."""
    if path_or_env is None:
        env = os.environ if environ is None else environ
        return parse_tokens(env.get(variable, ""), variable)
    path = Path(path_or_env)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidInput("tokens", f"cannot read token file {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise InvalidInput("tokens", f"{path} must hold a JSON object {{token: tenant}}")
    tokens: dict[str, str] = {}
    for i, (token, tenant) in enumerate(raw.items()):
        token, tenant = _check_entry(token, tenant, f"{path} entry {i + 1}")
        tokens[token] = tenant
    return tokens


class Authenticator:
    """Resolves ``Authorization: Bearer <token>`` to a ``Caller``. Tokens are kept only as
    SHA-256 digests, so lookups do not compare secrets byte by byte."""

    def __init__(self, tokens: Mapping[str, str] | None) -> None:
        self._table: dict[bytes, Caller] = {}
        for token, tenant in (tokens or {}).items():
            token, tenant = _check_entry(token, tenant, "tokens")
            operator = tenant == OPERATOR
            self._table[_digest(token)] = Caller(None if operator else tenant, operator)

    @property
    def development(self) -> bool:
        """True when no token is configured: everyone is an operator without a tenant."""
        return not self._table

    def resolve(self, authorization: str | None) -> Caller | str:
        """The caller, or why the request is unauthenticated (``"missing"`` or
        ``"invalid"``)."""
        if self.development:
            return DEV_CALLER
        if not authorization:
            return "missing"
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return "missing"
        caller = self._table.get(_digest(token.strip()))
        return "invalid" if caller is None else caller


__all__ = [
    "DEV_CALLER",
    "ENV_VAR",
    "OPERATOR",
    "Authenticator",
    "Caller",
    "load_tokens",
    "parse_tokens",
]
