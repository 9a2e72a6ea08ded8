"""The ``wakeful`` command line. ``wakeful --help`` lists the commands; exit codes are in
``wakeful.cli.common``."""

from __future__ import annotations

import click

from wakeful.cli.inspect import dispatches, quarantine, threads, workers
from wakeful.cli.langgraph import langgraph
from wakeful.cli.providers import providers
from wakeful.cli.run import bench, demo, hand, migrate, relay, run_command, serve, worker


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="wakeful")
def cli() -> None:
    """wakeful: durable LLM agents. Exit codes: 0 ok, 1 failed, 2 usage, 3 not found,
    4 conflict, 5 store unavailable, 6 invalid input."""


for command in (demo, worker, relay, run_command, serve, hand, migrate, bench):
    cli.add_command(command)
for group in (threads, dispatches, quarantine, workers):
    cli.add_command(group)
cli.add_command(providers)
cli.add_command(langgraph)


def main() -> None:
    cli()


__all__ = ["cli", "main"]
