"""The worker fleet: workers, dispatch submission, wake signals, the relay."""

from wakeful.fleet.client import cancel, resume, send_message, submit
from wakeful.fleet.registry import Registry, Target
from wakeful.fleet.relay import RELAY_THREAD, RelayLoop
from wakeful.fleet.wake import LocalWake, NoWake, Wake
from wakeful.fleet.worker import Worker, WorkerStats

__all__ = [
    "RELAY_THREAD",
    "LocalWake",
    "NoWake",
    "Registry",
    "RelayLoop",
    "Target",
    "Wake",
    "Worker",
    "WorkerStats",
    "cancel",
    "resume",
    "send_message",
    "submit",
]
