"""``wakeful providers check``: can wakeful use this OpenAI-compatible endpoint?

Exit codes: 0 usable (streams text and tool calls); 1 it answered but the streamed request
failed (wrong model, key, path, no streaming ...); 5 unreachable (nothing answered); 6
invalid input; 7 usable for text only (tool calls did not work)."""

from __future__ import annotations

import asyncio
import os
import sys

import click

from wakeful.cli.common import EXIT_FAILED, EXIT_INVALID, EXIT_UNAVAILABLE, emit, errors, table
from wakeful.errors import InvalidInput

EXIT_TEXT_ONLY = 7
EXIT_CODES = {"usable": 0, "text_only": EXIT_TEXT_ONLY, "unusable": EXIT_FAILED}
EXIT_CODES["unreachable"] = EXIT_UNAVAILABLE
VERDICTS = {
    "usable": "usable: streams text and tool calls",
    "text_only": "usable for text only: tool calls did not work",
    "unusable": "not usable: the endpoint answered, but the streamed request failed",
    "unreachable": "not usable: nothing answered",
}
MARKS = {True: "[green]yes[/green]", False: "[red]no[/red]", None: ""}


@click.group("providers")
def providers() -> None:
    """Model endpoints."""


@providers.command("check")
@click.option(
    "--base-url", required=True, metavar="URL", help="The API root, e.g. http://localhost:8000/v1."
)
@click.option("--model", default=None, metavar="M", help="Default: the first of {URL}/models.")
@click.option(
    "--api-key-env",
    default=None,
    metavar="VAR",
    help="The environment variable holding the key (none is sent without it).",
)
@click.option(
    "--timeout", default=30.0, show_default=True, help="Seconds to connect, and of silence."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def check(
    base_url: str, model: str | None, api_key_env: str | None, timeout: float, as_json: bool
) -> None:
    """Send one tiny streamed request and one with a tool, and report what the endpoint
    supports. Exit 0 usable, 1 failed, 5 unreachable, 6 invalid input, 7 text only."""
    from wakeful.providers.check import EndpointReport, check_endpoint

    try:
        key = _api_key(api_key_env)
        report = asyncio.run(check_endpoint(base_url, model=model, api_key=key, timeout=timeout))
    except InvalidInput as exc:
        errors.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        sys.exit(EXIT_INVALID)

    def render(report: EndpointReport) -> None:
        rows = [(c.name, MARKS[c.ok], c.detail) for c in report.checks]
        rows.append(("workarounds", "", "; ".join(report.workarounds) or "none"))
        table(f"{report.base_url} ({report.model or 'no model'})", ["check", "", "detail"], rows)
        errors.print(VERDICTS[report.verdict], highlight=False, soft_wrap=True)

    emit(report, as_json, render)
    sys.exit(EXIT_CODES[report.verdict])


def _api_key(variable: str | None) -> str | None:
    if variable is None:
        return None
    value = os.environ.get(variable)
    if not value:
        raise InvalidInput("--api-key-env", f"${variable} is not set or empty")
    return value
