"""How LangGraph values become JSON in a wakeful store, and thread ids become wakeful ids.

A value is stored either as itself (``{"j": value}``, when it is plain JSON and the saver
uses its default serializer) or through LangGraph's serializer protocol as
``{"t": type, "b": base64 bytes}``. The ``pickle`` type is refused in both directions unless
the saver was opened with ``allow_pickle=True``: a pickle read from storage runs code.
"""

from __future__ import annotations

import base64
import hashlib
import math
from typing import Any, TypeVar

import msgspec
from langgraph.checkpoint.serde.base import SerializerProtocol

from wakeful.errors import InvalidInput, InvalidState
from wakeful.ids import MAX_ID_LENGTH, check_id

PICKLE = "pickle"
HASHED_PREFIX = "lgx-"

_INT_RANGE = range(-(2**63), 2**64)
T = TypeVar("T")


def is_plain_json(value: Any, depth: int = 0) -> bool:
    """True if ``value`` comes back from JSON as an equal value of the same types (no
    tuples, no subclasses, string keys only, finite floats, 64-bit integers)."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return value in _INT_RANGE
    if kind is float:
        return math.isfinite(value)
    if depth > 64:
        return False
    if kind is list:
        items: Any = value
    elif kind is dict:
        for key in value:
            if type(key) is not str:
                return False
        items = value.values()
    else:
        return False
    # Loops, not generators, and strings (most leaves) without a call: every saved value
    # goes through here on the event loop.
    for item in items:  # noqa: SIM110
        if type(item) is not str and not is_plain_json(item, depth + 1):
            return False
    return True


class ValueCodec:
    """Encodes values to stored JSON and back. ``plain_json`` lets plain JSON values skip
    the serializer (only with LangGraph's default one: a custom serializer, an encrypting
    one say, sees every value)."""

    def __init__(self, serde: SerializerProtocol, *, plain_json: bool, allow_pickle: bool) -> None:
        self.serde = serde
        self.plain_json = plain_json
        self.allow_pickle = allow_pickle

    def encode(self, value: Any, what: str, *args: object) -> dict[str, Any]:
        """``value`` as stored JSON. ``what`` names it in a refusal, formatted with
        ``args`` (``what.format(*args)``) only then: the saver encodes every value it saves,
        and a label made for each was string formatting on the event loop for nothing."""
        if self.plain_json and is_plain_json(value):
            return {"j": value}
        kind, data = self.serde.dumps_typed(value)
        if kind == PICKLE and not self.allow_pickle:
            raise InvalidInput(
                what.format(*args) if args else what,
                f"{type(value).__name__} can only be serialized with pickle, which this saver "
                "refuses; make the value JSON- or msgpack-serializable, or open the saver "
                "with allow_pickle=True if every reader of the store is trusted",
            )
        return {"t": kind, "b": base64.b64encode(data).decode("ascii")}

    def decode(self, stored: dict[str, Any], what: str, *, fresh: bool = False) -> Any:
        """The value ``stored`` holds. ``fresh``: ``stored`` is the caller's own copy (just
        decoded from an index entry), so a plain JSON value is handed over as it is."""
        if "j" in stored:
            if fresh:
                return stored["j"]
            # A fresh copy: the caller may mutate what it gets; the cached record must not
            # change with it.
            return msgspec.json.decode(msgspec.json.encode(stored["j"]))
        kind = stored["t"]
        if kind == PICKLE and not self.allow_pickle:
            raise InvalidState(
                "stored value",
                what,
                "pickled",
                "this saver refuses to unpickle (it can run code); open it with "
                "allow_pickle=True only if the store's writers are trusted",
            )
        return self.serde.loads_typed((kind, base64.b64decode(stored["b"])))


_KNOWN = 4096
"""How many recent answers of ``store_thread_id`` and ``valid_id`` are remembered (every
saver call asks again for the same few ids; the check is a regular expression)."""
_thread_ids: dict[str, str] = {}
_valid_ids: dict[str, bool] = {}


def store_thread_id(thread_id: object) -> str:
    """The wakeful thread that holds LangGraph thread ``thread_id``: the same id when it
    fits wakeful's identifier alphabet, else a stable hash of it (the records keep the
    original, so listing reports it)."""
    if not isinstance(thread_id, str) or not thread_id:
        raise InvalidInput("thread_id", "must be a non-empty string (config['configurable'])")
    known = _thread_ids.get(thread_id)
    if known is not None:
        return known
    try:
        if not thread_id.startswith(HASHED_PREFIX):
            return _remember(_thread_ids, thread_id, check_id("thread_id", thread_id))
    except InvalidInput:
        pass
    digest = hashlib.sha256(thread_id.encode("utf-8")).hexdigest()
    return _remember(_thread_ids, thread_id, (HASHED_PREFIX + digest)[:MAX_ID_LENGTH])


def valid_id(value: str) -> bool:
    known = _valid_ids.get(value)
    if known is not None:
        return known
    try:
        check_id("run_id", value)
    except InvalidInput:
        return _remember(_valid_ids, value, False)
    return _remember(_valid_ids, value, True)


def _remember(answers: dict[str, T], key: str, answer: T) -> T:
    if len(answers) >= _KNOWN:
        answers.clear()
    answers[key] = answer
    return answer
