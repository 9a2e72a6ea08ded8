"""The worker fleet: workers, dispatch submission, wake signals, the relay, webhooks.

``PostgresWake`` (``wakeful.fleet.pgwake``), ``NatsWake`` (``wakeful.fleet.natswake``) and
the remote hand (``wakeful.fleet.hand``) are imported from their modules, so their
dependencies load only when used."""

from wakeful.fleet.client import cancel, edit_message, regenerate, resume, send_message, submit
from wakeful.fleet.registry import Registry, Target
from wakeful.fleet.relay import RELAY_THREAD, RelayLoop
from wakeful.fleet.wake import LocalWake, NoWake, Wake
from wakeful.fleet.webhooks import WebhookConfig
from wakeful.fleet.worker import Worker, WorkerStats

__all__ = [
    "RELAY_THREAD",
    "LocalWake",
    "NoWake",
    "Registry",
    "RelayLoop",
    "Target",
    "Wake",
    "WebhookConfig",
    "Worker",
    "WorkerStats",
    "cancel",
    "edit_message",
    "regenerate",
    "resume",
    "send_message",
    "submit",
]
