"""A registry for the CLI tests: ``tests.cli_app:registry`` (a factory: fresh scripts each
time the CLI loads it)."""

from __future__ import annotations

from wakeful.agent import Agent
from wakeful.fleet import Registry
from wakeful.providers.scripted import Scripted, reply


def registry() -> Registry:
    model = Scripted.of(reply("Hello from the command line.", chunk=5))
    return Registry().add("greeter", Agent("greeter", model, "Greet."))


def hand_tools() -> dict[str, object]:
    def echo(text: str) -> str:
        return text

    return {"echo": echo}
