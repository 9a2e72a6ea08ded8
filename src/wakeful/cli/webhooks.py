"""The worker's webhook options: ``--webhook-secret`` (or ``WAKEFUL_WEBHOOK_SECRET``) and
``--allow-private-webhooks`` (``wakeful.fleet.webhooks``)."""

from __future__ import annotations

from typing import Any

import click

from wakeful.errors import InvalidInput

WEBHOOK_OPTIONS = (
    click.option(
        "--webhook-secret",
        "webhook_secrets",
        multiple=True,
        envvar="WAKEFUL_WEBHOOK_SECRET",
        metavar="whsec_...",
        help="Signs the webhooks this worker delivers (Standard Webhooks; repeat it, or "
        "separate them by spaces in WAKEFUL_WEBHOOK_SECRET, to sign with several while "
        "rotating). Without one, deliveries fail and are retried.",
    ),
    click.option(
        "--allow-private-webhooks",
        is_flag=True,
        help="Deliver webhooks to private, loopback and other non-global addresses too "
        "(refused by default: a submitter chooses the URL).",
    ),
)


def webhook_options(fn: Any) -> Any:
    for option in reversed(WEBHOOK_OPTIONS):
        fn = option(fn)
    return fn


def webhook_config(secrets: tuple[str, ...], allow_private: bool) -> Any:
    """The worker's ``WebhookConfig``; a malformed secret is a usage error (exit 2) whose
    message does not repeat it."""
    from wakeful.fleet.webhooks import WebhookConfig

    try:
        return WebhookConfig(secrets=secrets, allow_private=allow_private)
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), param_hint="--webhook-secret") from None


__all__ = ["webhook_config", "webhook_options"]
