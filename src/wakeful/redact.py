"""Credentials never reach a log line, a span or an error text.

``redact(text, secrets)`` replaces what looks like a credential: a bearer token, the value of
a credential query parameter (``CREDENTIAL_PARAM``: ``access_token``, ``auth``, ``t`` ...),
an ``api-key`` / ``x-api-key`` field, a provider key (``sk-...``) and any of the given
``secrets`` (the configured provider key); ``redact_query`` applies the query rule to a query
string (the server's spans record it so). ``RedactingFilter`` applies ``redact`` to every
record of a logger; ``install_redaction`` puts it on the server's loggers and uvicorn's.
Redaction is by shape, so it errs towards hiding: an id that happens to look like ``sk-...``
is hidden too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping

REDACTED = "[redacted]"
MIN_SECRET = 8
"""Shorter ``secrets`` are not searched for: replacing a 3-letter string everywhere would
garble the text and hide nothing worth hiding."""

_CREDENTIAL_WORDS = (
    r"token|secret|passw|auth|bearer|api[_-]?key|apikey|credential|signature|session|jwt"
    r"|cookie"
)
_CREDENTIAL_EXACT = r"key|sig|t|pwd|pass|code"
_PARAM = rf"[\w.%-]*(?:{_CREDENTIAL_WORDS})[\w.%-]*|{_CREDENTIAL_EXACT}"
CREDENTIAL_PARAM = re.compile(rf"(?i){_PARAM}")
"""The one rule for a query parameter whose value is a credential: a name containing one of
the words (``access_token``, ``Authorization``, ``auth``, ``bearer``, ``x-api-key``,
``client_secret``, ``password`` ...) or one of the short names (``t``, ``key``, ``sig``,
``code``). It errs towards hiding: ``?author=`` is hidden too."""
_QUERY = re.compile(rf"(?i)((?:^|[?&;])(?:{_PARAM})=)()[^&#\s\"'<>]*")

_PATTERNS = (
    # Authorization: Bearer <token>, wherever it appears ("bearer token" in prose stays)
    re.compile(r"(?i)\b(bearer)(\s+)[A-Za-z0-9._~+/=-]{8,}"),
    # ?access_token=... &t=... in a URL or a query string
    _QUERY,
    # "api_key": "...", x-api-key: ..., api-key=...
    re.compile(r"(?i)\b((?:x-)?api[_-]?key)(\"?\s*[:=]\s*\"?)[^\s\"',;&}]+"),
    # provider keys: OpenAI sk-..., sk-proj-..., Anthropic sk-ant-...
    re.compile(r"()()\bsk-[A-Za-z0-9_-]{8,}"),
)


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every credential replaced by ``[redacted]``."""
    for secret in secrets:
        if secret and len(secret) >= MIN_SECRET:
            text = text.replace(secret, REDACTED)
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    return text


def redact_query(query: str) -> str:
    """A URL's query string (without the ``?``) with the value of every credential
    parameter (``CREDENTIAL_PARAM``) replaced by ``[redacted]``: what logs and spans
    record of a request's query."""
    return _QUERY.sub(lambda m: f"{m.group(1)}{REDACTED}", query)


def header_secrets(headers: Mapping[str, str]) -> list[str]:
    """The credentials a request sent (``Authorization`` and ``x-api-key`` values), to be
    redacted from what the server answers (an upstream error can echo the key)."""
    found: list[str] = []
    for name, value in headers.items():
        lowered = name.lower()
        if lowered == "authorization":
            found.append(value.partition(" ")[2].strip() or value)
        elif lowered in ("x-api-key", "api-key"):
            found.append(value)
    return found


class RedactingFilter(logging.Filter):
    """Redacts a record's message, its arguments and its exception text before any handler
    sees them. The arguments keep their shape (uvicorn's access formatter unpacks them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        elif record.args:  # a mapping, or an object formatted by its str()
            record.msg, record.args = redact(record.getMessage()), ()
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            return True  # a broken format: logging reports it as it always does
        clean = redact(message)
        if clean != message:  # a credential split between the format and its arguments
            record.msg, record.args = clean, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


REDACTED_LOGGERS = ("wakeful", "wakeful.server", "uvicorn.access", "uvicorn.error")
"""Loggers whose records are redacted (a filter on a logger applies to the records it
creates, not to those of its children, so each logging one is named)."""


def install_redaction(names: Iterable[str] = REDACTED_LOGGERS) -> None:
    """Put one ``RedactingFilter`` on each named logger (again: no second one)."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in logger.filters):
            logger.addFilter(RedactingFilter())


__all__ = [
    "CREDENTIAL_PARAM",
    "REDACTED",
    "RedactingFilter",
    "header_secrets",
    "install_redaction",
    "redact",
    "redact_query",
]
