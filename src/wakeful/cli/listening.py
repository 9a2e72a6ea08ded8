"""Where a server command listens: the port checked before startup, a startup failure as
one line, and the refusal to serve without tokens beyond loopback (``serve``, ``hand serve``,
``worker --metrics-port``)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import click

from wakeful.cli.common import EXIT_CONFLICT, EXIT_USAGE, fail


def check_port(host: str, port: int, option: str = "--port") -> None:
    """Fail with one line (exit 4) when ``host:port`` cannot be listened on, before a
    server starts and fails deep inside its startup; ``option`` is the one to change."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror}", EXIT_CONFLICT)
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            fail(
                f"cannot listen on {host}:{port}: {exc.strerror or exc}; is another server "
                f"running there? pick another {option}",
                EXIT_CONFLICT,
            )


@contextlib.contextmanager
def startup_failure(what: str, host: str, port: int) -> Iterator[None]:
    """uvicorn exits the process when it cannot start (a port taken since ``check_port``):
    report it as one line instead."""
    try:
        yield
    except SystemExit as exc:
        if exc.code in (0, None):
            raise
        fail(f"{what} could not start on {host}:{port} (see the log above)", EXIT_CONFLICT)


EXPOSURE_OPTIONS = (
    click.option(
        "--allowed-host",
        "allowed_hosts",
        multiple=True,
        metavar="NAME",
        help="A Host name this server answers besides the loopback ones when it has no tokens "
        "(repeatable; '*' for any), also accepted as the server's own Origin.",
    ),
    click.option(
        "--allow-unauthenticated-network",
        is_flag=True,
        help="Listen on a non-loopback --host without tokens: anyone who reaches it has every "
        "right. Without this flag that is refused.",
    ),
    click.option(
        "--header-timeout",
        default=10.0,
        show_default=True,
        type=click.FloatRange(min=0, min_open=True),
        help="Seconds a connection may take to send its request headers; then it is closed.",
    ),
    click.option(
        "--max-connections",
        default=2048,
        show_default=True,
        type=click.IntRange(min=1),
        help="Connections open at once (lowered to fit the process's file descriptor limit); "
        "more are closed when accepted.",
    ),
)


def exposure_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(EXPOSURE_OPTIONS):
        fn = option(fn)
    return fn


def check_exposure(what: str, host: str, tokens: Mapping[str, str], allow: bool) -> None:
    """Refuse (one line, exit 2) to serve without tokens on an address other than loopback,
    unless ``--allow-unauthenticated-network``: every caller would have every right."""
    from wakeful.fleet.exposure import is_loopback

    if tokens or allow or is_loopback(host.strip().strip("[]").lower()):
        return
    fail(
        f"refusing to serve {what} on {host or 'every interface'} without tokens: anyone who "
        f"can reach it could use it; configure tokens, listen on 127.0.0.1, or pass "
        f"--allow-unauthenticated-network (and --allowed-host NAME for the names clients use)",
        EXIT_USAGE,
    )
