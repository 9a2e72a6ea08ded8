"""What a web browser can make a wakeful HTTP service do: the Host names a server answers
and the Origins a state-changing request may come from. Shared by the API and the remote
hand (``docs/decisions/0034-browser-and-network-exposure.md``).

Two rules, checked before authentication and before any body is read:

- **Host** (DNS rebinding): a server without tokens (development mode) answers only Host
  names that are loopback (``localhost``, ``127.0.0.1`` and the rest of 127/8, ``[::1]``, any
  port) or configured (``allowed_hosts``); others get 421, a missing or malformed Host 400.
  A page on ``evil.example`` whose name resolves to 127.0.0.1 sends ``Host: evil.example``.
  With tokens the Host is not checked unless names are configured (the token is what a
  rebinding page does not have).
- **Origin** (cross-site request forgery), in every mode: a ``POST``, ``PUT``, ``PATCH`` or
  ``DELETE`` whose ``Origin`` header is present and is not the server's own (the scheme's
  host and port equal to the request's Host, or a configured name) is refused 403. Browsers
  send ``Origin`` on every cross-origin request of these methods (forms and ``fetch`` alike;
  ``null`` from sandboxed or privacy-sensitive contexts, refused too); command-line clients
  and the Python client send none and are not affected.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

STATE_CHANGING = frozenset(("POST", "PUT", "PATCH", "DELETE"))
LOOPBACK_NAMES = frozenset(("localhost",))
HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*\.?")
DEFAULT_PORTS = {"http": 80, "https": 443}
ANY_HOST = "*"
"""An ``allowed_hosts`` entry that accepts every Host name (a server behind a proxy that
checks them itself)."""


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: its status, problem slug, title and detail."""

    status: int
    slug: str
    title: str
    detail: str


def split_host(value: str) -> tuple[str, int | None] | None:
    """``name``, ``name:port``, ``[v6]`` or ``[v6]:port`` as (lower-case name without
    brackets, port); ``None`` when it is not one of those."""
    value = value.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
    else:
        name, colon, port_text_ = value.partition(":")
        port_text = port_text_ if colon else None
    name = name.removesuffix(".")  # "localhost." is localhost
    if not name or any(c.isspace() or c in "/@?#" for c in name):
        return None
    if port_text is None:
        return name, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    return name, int(port_text)


@functools.lru_cache(maxsize=256)
def is_loopback(name: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ``::1``)."""
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_allowed_hosts(names: Iterable[str]) -> frozenset[str]:
    """The configured names, lower-case (an IPv6 address without brackets); ``ValueError``
    for one that is not a host name or address (with a port, a scheme or a path)."""
    checked: set[str] = set()
    for raw in names:
        name = raw.strip().lower()
        if name.startswith("[") and name.endswith("]"):
            name = name[1:-1]
        if name != ANY_HOST and not _is_address(name) and not HOST_NAME.fullmatch(name):
            raise ValueError(
                f"allowed host {raw!r} is not a host name (give the name only, like "
                f"api.example.com, without scheme or port)"
            )
        checked.add(name)
    return frozenset(checked)


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class Exposure:
    """The Host and Origin rules of one server (see the module docstring)."""

    def __init__(self, *, development: bool, allowed_hosts: Iterable[str] = ()) -> None:
        self.allowed = check_allowed_hosts(allowed_hosts)
        self.check_host = (development or bool(self.allowed)) and ANY_HOST not in self.allowed

    def refusal(
        self, method: str, headers: Iterable[tuple[bytes, bytes]], *, probe: bool = False
    ) -> Refusal | None:
        """Why a request with ``method`` and raw ASGI ``headers`` is refused, or ``None``.
        A ``probe`` (a health check: nothing to read, nothing to change) skips the Host
        rule, so load balancers and orchestrators may probe by address."""
        host_header: str | None = None
        origin: str | None = None
        for name, value in headers:
            if name == b"host" and host_header is None:
                host_header = value.decode("latin-1")
            elif name == b"origin" and origin is None:
                origin = value.decode("latin-1")
        host = split_host(host_header) if host_header is not None else None
        if self.check_host and not probe:
            if host is None:
                return Refusal(
                    400,
                    "bad-host",
                    "Bad Host header",
                    "the request has no valid Host header; send the server's name and port",
                )
            if not self._allowed(host[0]):
                return Refusal(
                    421,
                    "host-not-allowed",
                    "Host not allowed",
                    f"this server does not answer the name {host[0]!r}: without tokens it "
                    f"answers loopback names only; its operator can add names with "
                    f"--allowed-host",
                )
        if origin is not None and method.upper() in STATE_CHANGING and not self._own(origin, host):
            return Refusal(
                403,
                "foreign-origin",
                "Cross-origin request refused",
                "a state-changing request from another web origin is refused (cross-site "
                "request forgery); send it from the server's own pages or without an Origin",
            )
        return None

    def _allowed(self, name: str) -> bool:
        return is_loopback(name) or name in self.allowed

    def _own(self, origin: str, host: tuple[str, int | None] | None) -> bool:
        parsed = parse_origin(origin)
        if parsed is None:
            return False  # "null", or not a web origin
        name, port = parsed
        if name in self.allowed or ANY_HOST in self.allowed:
            return True
        return host is not None and (name, port) == (host[0], host[1] or port_default(origin))


@functools.lru_cache(maxsize=256)
def parse_origin(origin: str) -> tuple[str, int] | None:
    """An ``http``/``https`` origin as (lower-case host, port, the scheme's default when
    absent); ``None`` for ``null`` or anything else. Cached: a server sees few origins."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return parts.hostname.lower(), port or DEFAULT_PORTS[scheme]


def port_default(origin: str) -> int:
    """The default port of the origin's scheme (80 unless it is ``https``)."""
    return DEFAULT_PORTS["https"] if origin.strip().lower().startswith("https:") else 80


PROBES = frozenset(("/healthz", "/readyz"))
"""The health-check paths of wakeful's services (``probe=True``)."""

__all__ = [
    "ANY_HOST",
    "PROBES",
    "STATE_CHANGING",
    "Exposure",
    "Refusal",
    "check_allowed_hosts",
    "is_loopback",
    "split_host",
]
