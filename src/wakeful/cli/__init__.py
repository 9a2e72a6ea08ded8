"""The ``wakeful`` command line. ``wakeful --help`` lists the commands (docs/cli.md has an
example session); exit codes are in ``wakeful.cli.common``.

Every command reports a failure as one ``error:`` line on stderr with a documented exit code
(never a traceback), and takes ``--log-level`` and ``--log-format`` (``wakeful.cli.logs``)."""

from __future__ import annotations

from typing import Any

import click

from wakeful.cli.admin import migrate, prune, status
from wakeful.cli.common import as_failure, usage_failure
from wakeful.cli.deploys import runs
from wakeful.cli.doctor import doctor
from wakeful.cli.inspect import dispatches, threads, workers
from wakeful.cli.langgraph import langgraph
from wakeful.cli.limits import limits
from wakeful.cli.logs import logging_options
from wakeful.cli.providers import providers
from wakeful.cli.quarantine import quarantine
from wakeful.cli.run import run_command, submit_command
from wakeful.cli.schedules import schedules
from wakeful.cli.services import bench, demo, hand, relay, serve, worker
from wakeful.cli.travel import threads_history  # noqa: F401  (adds the time-travel commands)
from wakeful.cli.workflow import cancel_command, resume_command, send_command
from wakeful.errors import WakefulError


class WakefulGroup(click.Group):
    """The root group: a ``WakefulError`` from any command becomes one ``error:`` line and
    its exit code; so does a usage error of a command (a bad option value, an ``--app`` that
    is not an app), with exit code 2 and where to read the command's help."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except WakefulError as exc:
            raise as_failure(exc) from None
        except click.exceptions.NoArgsIsHelpError:
            raise  # a group without a command shows its help
        except click.UsageError as exc:
            raise usage_failure(exc) from None


@click.group(cls=WakefulGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="wakeful")
def cli() -> None:
    """wakeful: durable LLM agents.

    Exit codes: 0 ok, 1 failed, 2 usage, 3 not found, 4 conflict or refused, 5 store
    unavailable (retry later), 6 invalid input or configuration, 7 usable for text only
    (providers check)."""


def attach_common_options(command: click.Command) -> None:
    """Give every leaf command ``--log-level`` and ``--log-format``."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            attach_common_options(sub)
        return
    names = {name for param in command.params for name in getattr(param, "opts", ())}
    command.params.extend(o for o in logging_options() if not names & set(o.opts))


for command in (
    demo,
    run_command,
    submit_command,
    cancel_command,
    resume_command,
    send_command,
    worker,
    relay,
    serve,
    hand,
    migrate,
    prune,
    status,
    doctor,
    bench,
    threads,
    dispatches,
    quarantine,
    schedules,
    workers,
    limits,
    runs,
    providers,
    langgraph,
):
    cli.add_command(command)


def main() -> None:
    attach_common_options(cli)
    cli()


attach_common_options(cli)

__all__ = ["cli", "main"]
