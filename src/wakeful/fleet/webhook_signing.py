"""Webhook URLs, addresses and signatures (issue 43), the Standard Webhooks way.

- **URLs** (``check_webhook_url``): ``http`` or ``https``, a host, at most
  ``MAX_URL_LENGTH`` characters, no fragment, and no credentials (``user:pass@``): a URL is
  stored with the run and shown by the console, so a secret in it would leak; receivers
  verify the signature instead. ``redact_url`` is what log lines and listings show: the
  query string (where tokens hide) is cut.
- **Addresses** (``resolve``): a delivery resolves the host first and is refused
  when any address is not globally routable (loopback, RFC 1918 private, link-local,
  carrier-grade NAT, unique-local, multicast, reserved), unless the worker allows private
  deliveries (``WebhookConfig.allow_private``, ``wakeful worker --allow-private-webhooks``).
  A run's submitter chooses the URL; without this rule a tenant could make workers POST to
  the cloud metadata service or an internal admin port.
- **Signatures** (``sign``/``verify``): headers ``webhook-id``, ``webhook-timestamp``
  (integer seconds) and ``webhook-signature: v1,<base64 HMAC-SHA256 of
  "{id}.{timestamp}.{body}">``, the key being the base64 part of a ``whsec_...`` secret.
  Several secrets (rotation) sign with each, the signatures separated by spaces.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from wakeful.errors import InvalidInput

MAX_URL_LENGTH = 2048
SECRET_PREFIX = "whsec_"
TOLERANCE = 300
"""Seconds a receiver accepts between a delivery's timestamp and its own clock (the
Standard Webhooks default), against replays."""


def check_webhook_url(url: object, field: str = "webhook") -> str:
    """``url`` when it is a webhook URL wakeful delivers to, else ``InvalidInput`` (which
    never repeats the URL: it may carry a secret)."""
    if not isinstance(url, str):
        raise InvalidInput(field, f"must be a URL string, got {type(url).__name__}")
    if not url or len(url) > MAX_URL_LENGTH:
        raise InvalidInput(field, f"must be 1 to {MAX_URL_LENGTH} characters long")
    if any(ord(c) <= 32 or ord(c) == 127 for c in url):
        raise InvalidInput(field, "must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidInput(field, f"is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise InvalidInput(field, "must be an http:// or https:// URL")
    if not parts.hostname:
        raise InvalidInput(field, "must name a host")
    if parts.username is not None or parts.password is not None:
        raise InvalidInput(
            field,
            "must not carry credentials (user:password@): URLs are stored and shown; "
            "receivers verify the webhook-signature header instead",
        )
    if parts.fragment:
        raise InvalidInput(field, "must not have a #fragment")
    del port
    return url


def redact_url(url: str) -> str:
    """``url`` without its query string, for logs and listings."""
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return "(not a valid URL)"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}{port}{parts.path}{'?…' if parts.query else ''}"


def _not_global(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


@dataclass(frozen=True)
class Target:
    """Where one delivery attempt connects: the checked ``addresses`` the URL's host
    resolved to (tried in order while a connection fails), and the request that reaches one
    with the URL's own name (``pinned`` URL, ``Host`` header, TLS server name)."""

    url: str
    addresses: tuple[str, ...]

    def pinned(self, address: str) -> str:
        """``url`` with its host replaced by ``address`` (and the port made explicit)."""
        parts = urlsplit(self.url)
        host = f"[{address}]" if ":" in address else address
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return urlunsplit(parts._replace(netloc=f"{host}:{port}"))

    @property
    def host_header(self) -> str:
        return urlsplit(self.url).netloc

    @property
    def server_name(self) -> str:
        return urlsplit(self.url).hostname or ""


async def resolve(url: str, allow_private: bool) -> Target | str:
    """The addresses a delivery to ``url`` connects to (those its host resolves to), or
    why it is refused: an address of the host is not globally routable and
    ``allow_private`` is false. The connection then goes to that checked address (the
    name is not resolved a second time), so a DNS answer that changes between the check
    and the connection (rebinding) cannot lead it elsewhere. A host that does not resolve
    is an ordinary failed attempt (``OSError``), retried later."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = [str(info[4][0]) for info in infos]
    if not addresses:
        raise OSError(f"{host} resolves to no address")
    for address in addresses:
        if not allow_private and _not_global(address):
            return (
                f"{parts.hostname} resolves to {address}, a private or reserved address; "
                f"workers deliver there only with --allow-private-webhooks"
            )
    return Target(url, tuple(dict.fromkeys(a.split("%", 1)[0] for a in addresses)))


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret (``InvalidInput`` otherwise; the
    message never repeats the secret)."""
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise InvalidInput("webhook secret", f"must look like {SECRET_PREFIX}<base64>")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput("webhook secret", "the part after whsec_ is not base64") from None
    if len(key) < 24:
        raise InvalidInput("webhook secret", "must hold at least 24 bytes (32 recommended)")
    return key


def new_secret() -> str:
    """A fresh ``whsec_`` secret of 32 random bytes."""
    import secrets

    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def signature(key: bytes, webhook_id: str, timestamp: int, body: bytes) -> str:
    content = f"{webhook_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def sign(secrets: Sequence[str], webhook_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The Standard Webhooks headers of one delivery attempt of ``body``."""
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(
            signature(secret_key(s), webhook_id, timestamp, body) for s in secrets
        ),
    }


def verify(secret: str, headers: dict[str, str], body: bytes, now: float) -> bool:
    """Whether ``headers`` (lower-case names) sign ``body`` with ``secret`` and the
    timestamp is within ``TOLERANCE`` seconds of ``now`` (a receiver's check; also what the
    documentation's example does)."""
    try:
        ident, stamp = headers["webhook-id"], int(headers["webhook-timestamp"])
    except (KeyError, ValueError):
        return False
    if abs(now - stamp) > TOLERANCE:
        return False
    expected = signature(secret_key(secret), ident, stamp, body)
    offered = headers.get("webhook-signature", "").split()
    return any(hmac.compare_digest(expected, s) for s in offered)


__all__ = [
    "check_webhook_url",
    "new_secret",
    "redact_url",
    "resolve",
    "secret_key",
    "sign",
    "verify",
]
