"""The web console at ``/console`` (``docs/console.md``).

Hand-written HTML, ES modules and CSS in ``assets/``, shipped in the wheel: there is no
build step, nothing is generated, and the page loads nothing from another host (it works
offline). The assets are public (they hold no data); every call the page makes goes to
``/v1`` with the bearer token the user signed in with, kept in the tab's session storage and
sent as an ``Authorization`` header, never as a cookie or in a URL.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.resources import files

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse

from wakeful.errors import NotFound

router = APIRouter(include_in_schema=False)

PREFIX = "/console"
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""Only this server's scripts, styles and API: an injected inline script does not run."""


@dataclass(frozen=True)
class Asset:
    body: bytes
    media_type: str
    etag: str


def _load() -> dict[str, Asset]:
    """Every asset by file name, read once (the set is fixed: a name not in it is 404, so a
    path can never reach outside the directory)."""
    found: dict[str, Asset] = {}
    for entry in (files(__name__) / "assets").iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in TYPES:
            body = entry.read_bytes()
            etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
            found[entry.name] = Asset(body, TYPES[suffix], etag)
    return found


ASSETS = _load()


def _send(request: Request, asset: Asset) -> Response:
    headers = {
        "ETag": asset.etag,
        "Cache-Control": "no-cache",  # revalidate: an upgraded server serves new assets
        "Content-Security-Policy": POLICY,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
    if request.headers.get("if-none-match") == asset.etag:
        return Response(status_code=304, headers=headers)
    return Response(asset.body, media_type=asset.media_type, headers=headers)


@router.get(PREFIX)
async def console_root() -> Response:
    return RedirectResponse(PREFIX + "/", status_code=308)


@router.get(PREFIX + "/")
async def console_page(request: Request) -> Response:
    return _send(request, ASSETS["index.html"])


@router.get(PREFIX + "/assets/{name}")
async def console_asset(name: str, request: Request) -> Response:
    asset = ASSETS.get(name)
    if asset is None:
        raise NotFound("console asset", name)
    return _send(request, asset)


__all__ = ["ASSETS", "router"]
