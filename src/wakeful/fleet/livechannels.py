"""Opening a live channel by name (``wakeful worker --live``, ``wakeful serve --live``)."""

from __future__ import annotations

from wakeful.fleet.live import LiveChannel, LocalLive


def open_live(kind: str, url: str | None = None) -> LiveChannel | None:
    """The channel named on a command line: ``none``, ``local``, ``postgres`` (``url``: a
    PostgreSQL URL) or ``nats`` (``url``: a NATS URL, default ``nats://127.0.0.1:4222``)."""
    if kind == "none":
        return None
    if kind == "local":
        return LocalLive()
    if kind == "postgres":
        if not url:
            raise ValueError("a postgres live channel needs a postgresql:// URL")
        from wakeful.fleet.pglive import PostgresLive

        return PostgresLive(url)
    if kind == "nats":
        from wakeful.fleet.natslive import NatsLive

        return NatsLive(url or "nats://127.0.0.1:4222")
    raise ValueError(f"unknown live channel {kind!r}: none, local, postgres or nats")


__all__ = ["open_live"]
