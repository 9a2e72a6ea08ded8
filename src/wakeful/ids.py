"""Identifier rules and input validation.

Identifiers (thread ids, holders, run ids, operation ids, dispatch ids, message ids, task
ids, checkpoint ids, worker ids) use one documented alphabet: ASCII letters, digits and
``. _ - : @ + =``; the first character a letter or a digit; 1 to 200 characters
(``MAX_ID_LENGTH``). They are safe in URLs, log lines and SQL parameters, and never used as
file paths. Bad values raise ``InvalidInput`` before any storage is touched.
"""

from __future__ import annotations

import math
import re
import uuid
from datetime import datetime

from wakeful.errors import InvalidInput

MAX_ID_LENGTH = 200
MAX_TTL_SECONDS = 7 * 24 * 3600.0
MAX_AGE_SECONDS = 100 * 366 * 24 * 3600.0
"""The longest retention age: a century (ages beyond it would overflow some date types)."""
MAX_PAGE = 10_000

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]*")


_KNOWN: set[str] = set()
"""Identifiers already found valid: a worker checks the same few (its thread's, run's,
dispatch's) a dozen times per dispatch, and a set lookup is cheaper than the pattern."""
_KNOWN_MAX = 4096


def check_id(field: str, value: object) -> str:
    """Return ``value`` if it is a valid identifier, else raise ``InvalidInput``."""
    if type(value) is str and value in _KNOWN:
        return value
    if not isinstance(value, str):
        raise InvalidInput(field, f"must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidInput(field, "must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidInput(field, f"is {len(value)} characters long; the limit is {MAX_ID_LENGTH}")
    if _ID.fullmatch(value) is None:
        raise InvalidInput(
            field,
            f"{value[:40]!r} has characters outside [A-Za-z0-9._:@+=-] "
            f"or does not start with a letter or digit",
        )
    if type(value) is str:  # a subclass could compare equal and hash alike, yet differ
        if len(_KNOWN) >= _KNOWN_MAX:
            _KNOWN.clear()
        _KNOWN.add(value)
    return value


def check_optional_id(field: str, value: object) -> str | None:
    if value is None or (type(value) is str and value in _KNOWN):
        return value
    return check_id(field, value)


def check_seconds(
    field: str, value: object, *, allow_zero: bool = False, maximum: float = MAX_TTL_SECONDS
) -> float:
    """A finite, positive (or zero when allowed) number of seconds, at most ``maximum`` (a
    week unless told)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(field, f"must be a number of seconds, got {type(value).__name__}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise InvalidInput(field, f"must be {'>= 0' if allow_zero else '> 0'} and finite")
    if seconds > maximum:
        raise InvalidInput(field, f"{seconds} s is longer than the limit of {maximum} s")
    return seconds


def check_count(field: str, value: object, *, minimum: int = 0, maximum: int = MAX_PAGE) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(field, f"must be an integer, got {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise InvalidInput(field, f"must be between {minimum} and {maximum}, got {value}")
    return value


def check_aware(field: str, value: object) -> datetime:
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInput(field, "must be a timezone-aware datetime")
    return value


def new_id(prefix: str = "") -> str:
    """A fresh random identifier in the id alphabet."""
    return f"{prefix}{uuid.uuid4().hex}"
