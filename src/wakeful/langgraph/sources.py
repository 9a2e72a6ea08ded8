"""Reading the databases of LangGraph's own savers, for ``wakeful langgraph import``.

``open_source(url)`` opens a ``SqliteSaver``/``AsyncSqliteSaver`` database
(``sqlite:///path.db``, read-only) or a ``PostgresSaver``/``AsyncPostgresSaver`` one
(``postgresql://...``; its tables are found on the connection's ``search_path``) and reads
one thread at a time, in one consistent snapshot per thread.

Values are read as the source's serializer wrote them (``Typed``: type and bytes) and are
never deserialized here: no pickle runs, and the application's classes need not be
importable. The one exception is a SQLite checkpoint, which holds its channel values inline:
a ``msgpack`` one is split at the msgpack level, keeping every extension (LangGraph's
encoded objects) as its raw bytes.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import quote, urlsplit

import ormsgpack
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from wakeful.errors import InvalidInput, NotFound, StoreUnavailable, UnsupportedStore
from wakeful.langgraph.codec import PICKLE, is_plain_json

TASKS = "__pregel_tasks"
"""LangGraph's channel of pending ``Send`` packets (``langgraph.checkpoint.serde.types``)."""
MSGPACK_OPTIONS = ormsgpack.OPT_NON_STR_KEYS

T = TypeVar("T")


@dataclass(frozen=True)
class Typed:
    """A value as LangGraph's serializer wrote it: ``serde.dumps_typed`` output."""

    kind: str
    data: bytes


@dataclass
class SourceCheckpoint:
    ns: str
    id: str
    parent: str | None
    body: Any
    """The checkpoint without ``channel_values``: a decoded dict, or ``Typed``."""
    values: dict[str, Any]
    """channel -> decoded plain value or ``Typed``."""
    metadata: Any


@dataclass(frozen=True)
class SourceWrite:
    ns: str
    checkpoint_id: str
    task_id: str
    task_path: str
    idx: int
    channel: str
    value: Typed


@dataclass
class SourceThread:
    thread_id: str
    checkpoints: list[SourceCheckpoint] = field(default_factory=list)
    writes: list[SourceWrite] = field(default_factory=list)


class Source(Protocol):
    """One LangGraph saver database, read thread by thread."""

    description: str

    async def thread_ids(self) -> list[str]:
        """Every thread with a checkpoint or a write, in order."""
        ...

    async def read(self, thread_id: str) -> SourceThread:
        """The thread's checkpoints (oldest first) and writes, from one snapshot."""
        ...


def raw_unpack(data: bytes) -> Any:
    """msgpack bytes -> Python, every extension kept as an ``ormsgpack.Ext``."""
    return ormsgpack.unpackb(data, ext_hook=ormsgpack.Ext, option=MSGPACK_OPTIONS)


def raw_value(value: Any) -> Any:
    """A value unpacked by ``raw_unpack``: itself when plain JSON, else repacked."""
    if is_plain_json(value):
        return value
    return Typed("msgpack", ormsgpack.packb(value, option=MSGPACK_OPTIONS))


@asynccontextmanager
async def open_source(url: str, *, allow_pickle: bool = False) -> AsyncIterator[Source]:
    """The LangGraph database at ``url``. ``allow_pickle``: a SQLite checkpoint pickled as a
    whole may be unpickled to split it (a pickle runs code when read). Raises
    ``InvalidInput`` for another scheme or a database without LangGraph's tables,
    ``NotFound`` for a missing SQLite file, ``StoreUnavailable`` for a PostgreSQL server
    that does not answer."""
    scheme = urlsplit(url).scheme.lower() if isinstance(url, str) else ""
    if scheme == "sqlite":
        source = SqliteSource(url, allow_pickle=allow_pickle)
        try:
            yield source
        finally:
            await source.close()
    elif scheme in ("postgresql", "postgres"):
        pg = await PostgresSource.connect(url)
        try:
            yield pg
        finally:
            await pg.close()
    else:
        raise InvalidInput(
            "--from",
            f"{str(url)[:80]!r} is not a LangGraph database URL; use sqlite:///path.db "
            "(SqliteSaver) or postgresql://... (PostgresSaver)",
        )


# ---------------------------------------------------------------- SQLite


class SqliteSource:
    """A ``SqliteSaver`` database, opened read-only. Its calls run in a worker thread."""

    def __init__(self, url: str, *, allow_pickle: bool = False) -> None:
        from wakeful.store.sqlite import parse_url

        self._allow_pickle = allow_pickle
        try:
            path = Path(parse_url(url))
        except UnsupportedStore as exc:
            raise InvalidInput("--from", str(exc)) from None
        if not path.is_file():
            raise NotFound("SQLite database", str(path))
        self.description = f"sqlite:///{path}"
        self._lock = asyncio.Lock()
        try:
            self._db = sqlite3.connect(
                f"file:{quote(str(path.resolve()))}?mode=ro",
                uri=True,
                check_same_thread=False,
                isolation_level=None,
            )
            tables = {
                row[0]
                for row in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
        except sqlite3.DatabaseError as exc:
            raise InvalidInput(
                "--from", f"{path} is not a readable SQLite database: {exc}"
            ) from None
        if not {"checkpoints", "writes"} <= tables:
            self._db.close()
            raise InvalidInput(
                "--from",
                f"{path} has no LangGraph SqliteSaver tables (checkpoints, writes); "
                "is it the database the application's SqliteSaver writes?",
            )
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(writes)")}
        self._task_path = "task_path" if "task_path" in columns else "''"

    async def _call(self, fn: Callable[[], T]) -> T:
        async with self._lock:
            try:
                return await asyncio.to_thread(fn)
            except sqlite3.DatabaseError as exc:
                raise InvalidInput("--from", f"reading {self.description} failed: {exc}") from None

    async def close(self) -> None:
        async with self._lock:
            self._db.close()

    async def thread_ids(self) -> list[str]:
        def read() -> list[str]:
            rows = self._db.execute(
                "SELECT thread_id FROM checkpoints UNION SELECT thread_id FROM writes ORDER BY 1"
            )
            return [str(row[0]) for row in rows]

        return await self._call(read)

    async def read(self, thread_id: str) -> SourceThread:
        def read() -> SourceThread:
            thread = SourceThread(thread_id)
            self._db.execute("BEGIN")  # one snapshot for both tables
            try:
                rows = self._db.execute(
                    "SELECT checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, "
                    "checkpoint, metadata FROM checkpoints WHERE thread_id = ? "
                    "ORDER BY checkpoint_id, checkpoint_ns",
                    (thread_id,),
                ).fetchall()
                writes = self._db.execute(
                    f"SELECT checkpoint_ns, checkpoint_id, task_id, {self._task_path}, idx, "
                    "channel, type, value FROM writes WHERE thread_id = ? "
                    "ORDER BY checkpoint_id, checkpoint_ns, task_id, idx",
                    (thread_id,),
                ).fetchall()
            finally:
                self._db.execute("COMMIT")
            for ns, cid, parent, kind, blob, metadata in rows:
                where = f"thread {thread_id!r} checkpoint {cid!r}"
                body, values = split_checkpoint(kind, bytes(blob), where, self._allow_pickle)
                thread.checkpoints.append(
                    SourceCheckpoint(ns, cid, parent, body, values, _json(metadata, where))
                )
            thread.writes = [
                SourceWrite(ns, cid, task, path, idx, channel, Typed(kind, bytes(value or b"")))
                for ns, cid, task, path, idx, channel, kind, value in writes
            ]
            return thread

        return await self._call(read)


def split_checkpoint(
    kind: str, blob: bytes, where: str, allow_pickle: bool
) -> tuple[Any, dict[str, Any]]:
    """A SQLite checkpoint (channel values inline) -> (body, values), without deserializing
    anything LangGraph's serializer encoded: ``msgpack`` is split at the msgpack level,
    ``json`` (old savers) at the JSON level; ``pickle`` (a saver with ``pickle_fallback``)
    is unpickled only with ``allow_pickle``; other types are refused."""
    if kind == "msgpack":
        try:
            decoded = raw_unpack(blob)
        except ormsgpack.MsgpackDecodeError as exc:
            raise InvalidInput(where, f"the stored checkpoint is not msgpack: {exc}") from None
        if not isinstance(decoded, dict):
            raise InvalidInput(where, "the stored checkpoint is not a map")
        values = decoded.pop("channel_values", None) or {}
        return raw_value(decoded), {str(k): raw_value(v) for k, v in values.items()}
    if kind == "json":
        loaded = _json(blob, where)
        values = loaded.pop("channel_values", None) or {}
        return loaded, {
            str(k): Typed("json", json.dumps(v).encode("utf-8")) for k, v in values.items()
        }
    if kind == PICKLE:
        if not allow_pickle:
            raise InvalidInput(
                where,
                "the checkpoint is pickled (its saver fell back to pickle for a value), and a "
                "pickle runs code when it is read; rerun with --allow-pickle if every writer "
                "of the source was trusted",
            )
        # Unpickled once, here; each value is then serialized on its own, so only the
        # values msgpack cannot carry stay pickles.
        serde = JsonPlusSerializer(pickle_fallback=True)
        loaded = serde.loads_typed((kind, blob))
        if not isinstance(loaded, dict):
            raise InvalidInput(where, "the stored checkpoint is not a dict")
        values = loaded.pop("channel_values", None) or {}
        return Typed(*serde.dumps_typed(loaded)), {
            str(k): Typed(*serde.dumps_typed(v)) for k, v in values.items()
        }
    raise InvalidInput(
        where,
        f"the checkpoint is stored as {kind!r} (a custom serializer's type), which the import "
        "cannot split; only LangGraph's default serializer's checkpoints import",
    )


def _json(data: bytes | str | None, where: str) -> Any:
    if data is None:
        return {}
    try:
        loaded = json.loads(data)
    except ValueError as exc:
        raise InvalidInput(where, f"stored JSON does not parse: {exc}") from None
    if not isinstance(loaded, dict):
        raise InvalidInput(where, "stored JSON is not an object")
    return loaded


# ---------------------------------------------------------------- PostgreSQL


class PostgresSource:
    """A ``PostgresSaver`` database: tables ``checkpoints``, ``checkpoint_blobs`` and
    ``checkpoint_writes`` on the connection's ``search_path``."""

    def __init__(self, conn: Any, description: str, task_path: bool) -> None:
        self._conn = conn
        self.description = description
        self._task_path = "task_path" if task_path else "''"

    @classmethod
    async def connect(cls, url: str) -> PostgresSource:
        try:
            import psycopg
        except ModuleNotFoundError:
            raise InvalidInput(
                "--from", "reading PostgreSQL needs psycopg: pip install 'wakeful[postgres]'"
            ) from None
        parts = urlsplit(url)
        description = f"postgresql://{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}"
        description += parts.path
        try:
            conn = await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=10)
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"{description} did not answer: {exc}".strip()) from None
        except psycopg.ProgrammingError as exc:
            raise InvalidInput("--from", f"{description}: {exc}") from None
        try:
            cur = await conn.execute(
                "SELECT to_regclass('checkpoints') IS NOT NULL "
                "AND to_regclass('checkpoint_blobs') IS NOT NULL "
                "AND to_regclass('checkpoint_writes') IS NOT NULL"
            )
            row = await cur.fetchone()
            if not (row and row[0]):
                raise InvalidInput(
                    "--from",
                    f"{description} has no LangGraph PostgresSaver tables (checkpoints, "
                    "checkpoint_blobs, checkpoint_writes) on its search_path; name the "
                    "schema with ?options=-csearch_path%3D<schema> if they live elsewhere",
                )
            cur = await conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = "
                "'checkpoint_writes'::regclass AND attname = 'task_path' AND NOT attisdropped)"
            )
            row = await cur.fetchone()
        except BaseException:
            await conn.close()
            raise
        return cls(conn, description, bool(row and row[0]))

    async def close(self) -> None:
        await self._conn.close()

    async def thread_ids(self) -> list[str]:
        cur = await self._conn.execute(
            "SELECT thread_id FROM checkpoints UNION SELECT thread_id FROM checkpoint_writes "
            "ORDER BY 1"
        )
        return [str(row[0]) for row in await cur.fetchall()]

    async def read(self, thread_id: str) -> SourceThread:
        async with self._conn.transaction():
            await self._conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            rows = await (
                await self._conn.execute(
                    "SELECT checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, "
                    "metadata FROM checkpoints WHERE thread_id = %s "
                    "ORDER BY checkpoint_id, checkpoint_ns",
                    (thread_id,),
                )
            ).fetchall()
            blobs = await (
                await self._conn.execute(
                    "SELECT checkpoint_ns, channel, version, type, blob FROM checkpoint_blobs "
                    "WHERE thread_id = %s",
                    (thread_id,),
                )
            ).fetchall()
            writes = await (
                await self._conn.execute(
                    f"SELECT checkpoint_ns, checkpoint_id, task_id, {self._task_path}, idx, "
                    "channel, type, blob FROM checkpoint_writes WHERE thread_id = %s "
                    "ORDER BY checkpoint_id, checkpoint_ns, task_id, idx",
                    (thread_id,),
                )
            ).fetchall()
        by_version = {(ns, ch, ver): (kind, blob) for ns, ch, ver, kind, blob in blobs}
        thread = SourceThread(thread_id)
        thread.writes = [
            SourceWrite(ns, cid, task, path, idx, channel, Typed(kind or "", bytes(value)))
            for ns, cid, task, path, idx, channel, kind, value in writes
        ]
        for ns, cid, parent, checkpoint, metadata in rows:
            body = dict(checkpoint)
            # As PostgresSaver loads it: values inline in the checkpoint, then the blobs of
            # its channel versions (a blob wins; an "empty" one adds nothing).
            values: dict[str, Any] = dict(body.pop("channel_values", None) or {})
            for channel, version in (body.get("channel_versions") or {}).items():
                kind, blob = by_version.get((ns, channel, str(version)), ("empty", None))
                if kind != "empty" and blob is not None:
                    values[channel] = Typed(kind, bytes(blob))
            if body.get("v", 4) < 4 and parent:
                migrate_pending_sends(body, values, thread.writes, ns, parent)
            thread.checkpoints.append(
                SourceCheckpoint(ns, cid, parent, body, values, metadata or {})
            )
        return thread


def migrate_pending_sends(
    body: dict[str, Any],
    values: dict[str, Any],
    writes: list[SourceWrite],
    ns: str,
    parent: str,
) -> None:
    """What ``PostgresSaver`` does when it reads a checkpoint older than format 4: the
    parent's ``TASKS`` writes become the checkpoint's ``TASKS`` channel value."""
    sends = sorted(
        (w for w in writes if w.ns == ns and w.checkpoint_id == parent and w.channel == TASKS),
        key=lambda w: (w.task_path, w.task_id, w.idx),
    )
    if not sends:
        return
    if any(w.value.kind != "msgpack" for w in sends):
        raise InvalidInput(
            f"checkpoint {body.get('id')!r}",
            "its pending sends (format < 4) are not msgpack; the import cannot migrate them",
        )
    packets = [raw_unpack(w.value.data) for w in sends]
    values[TASKS] = Typed("msgpack", ormsgpack.packb(packets, option=MSGPACK_OPTIONS))
    versions = body.setdefault("channel_versions", {})
    versions[TASKS] = max(versions.values()) if versions else f"{1:032}.{0.0:016}"
