"""``GET /v1/whoami``: what a bearer token is (the console signs in with it)."""

from __future__ import annotations

from fastapi import APIRouter

from wakeful.server.access import CallerDep, StateDep
from wakeful.server.schemas import Identity

router = APIRouter(prefix="/v1", tags=["session"])


@router.get("/whoami")
async def whoami(state: StateDep, caller: CallerDep) -> Identity:
    """The caller's tenant and role: a client shows operator views only when ``operator``
    is true (the operator routes refuse other tokens with 403 anyway)."""
    return Identity(tenant=caller.tenant, operator=caller.operator, development=state.development)
