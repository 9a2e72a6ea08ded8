"""Stream checkpoints of a file store: one JSON file per run in ``<root>/stream-checkpoints/``.

A run's file is named ``run-<sha256 of the run id>.json``: the run id is validated first, and
then only its hash reaches the file system, so no run id is ever interpreted as a path and
every name is the same length on every platform. The file holds
``{"format": "wakeful.stream-checkpoint", "version": 1, "checkpoint": {...}}``; a read checks
that the checkpoint inside names the run asked for.

A put writes a temp file, fsyncs it, renames it over the run's file and fsyncs the directory.
Operations on one run are serialized; the fence (the checkpoint's token must be its thread's
current claim) is checked under that run's lock, so a put refused as stale changes nothing
and a late put from a superseded owner cannot overwrite its successor's checkpoint. Every
failure is a ``StreamCheckpointError`` (``reason``: ``invalid``, ``stale`` or ``storage``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import msgspec

from wakeful.errors import StreamCheckpointError, WakefulError
from wakeful.ids import check_id
from wakeful.records import StreamCheckpoint
from wakeful.store.diskfull import full_disk
from wakeful.store.file.codec import TMP_SUFFIX
from wakeful.store.file.fsutil import fsync_dir, write_synced
from wakeful.store.projected import ProjectedStore
from wakeful.store.validate import check_discard, discards, encode_stream_checkpoint

logger = logging.getLogger("wakeful.store.file")

FORMAT = "wakeful.stream-checkpoint"
VERSION = 1


class _File(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    format: str
    version: int
    checkpoint: StreamCheckpoint


class _Written(msgspec.Struct, kw_only=True):
    """``_File`` as written: the checkpoint is its checked encoding."""

    format: str
    version: int
    checkpoint: msgspec.Raw


_DECODER = msgspec.json.Decoder(_File)


def file_name(run_id: str) -> str:
    """The file name of a (validated) run id's checkpoint."""
    return f"run-{hashlib.sha256(run_id.encode()).hexdigest()}.json"


class FileStreamCheckpoints:
    """The ``StreamCheckpointStore`` of a ``FileStore``, fenced by the store's claims."""

    def __init__(self, store: ProjectedStore, directory: Path) -> None:
        self._store = store
        self._dir = directory
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._inflight: dict[str, str] = {}
        """run id -> thread id of every put between its fence check and its rename."""
        self._closed = False

    async def get(self, run_id: str) -> StreamCheckpoint | None:
        path = self._path(run_id)
        try:
            data = await asyncio.to_thread(_read, path)
        except OSError as exc:
            raise StreamCheckpointError(run_id, "storage", f"cannot read {path}: {exc}") from exc
        if data is None:
            return None
        checkpoint = _decode(path, data)
        if checkpoint is None or checkpoint.run_id != run_id:
            raise StreamCheckpointError(
                run_id, "storage", f"{path} does not hold a valid checkpoint of this run"
            )
        return checkpoint

    async def put(self, checkpoint: StreamCheckpoint) -> None:
        try:
            encoded = encode_stream_checkpoint(checkpoint)
        except WakefulError as exc:
            run_id = getattr(checkpoint, "run_id", "?")
            raise StreamCheckpointError(str(run_id)[:40], "invalid", str(exc)) from exc
        copy = encoded.checkpoint
        path = self._path(copy.run_id)
        async with self._run_lock(copy.run_id):
            try:
                claim = self._store.current_claim(copy.thread_id)
            except WakefulError as exc:
                raise StreamCheckpointError(copy.run_id, "storage", str(exc)) from exc
            if claim is None or claim.token != copy.token:
                raise StreamCheckpointError(
                    copy.run_id,
                    "stale",
                    f"token {copy.token} is not the current claim of thread {copy.thread_id!r}",
                )
            body = encoded.stamped(self._store.now()).body
            data = msgspec.json.encode(
                _Written(format=FORMAT, version=VERSION, checkpoint=msgspec.Raw(body))
            )
            self._inflight[copy.run_id] = copy.thread_id
            try:
                await asyncio.to_thread(_replace, path, data + b"\n")
            except OSError as exc:
                advice = full_disk(exc)
                raise StreamCheckpointError(
                    copy.run_id,
                    "storage",
                    f"cannot write {path}: {exc}" + (f"; {advice}" if advice else ""),
                ) from exc
            finally:
                del self._inflight[copy.run_id]

    async def delete(self, run_id: str) -> None:
        path = self._path(run_id)
        async with self._run_lock(run_id):
            try:
                await asyncio.to_thread(_remove, path, None)
            except OSError as exc:
                raise StreamCheckpointError(
                    run_id, "storage", f"cannot remove {path}: {exc}"
                ) from exc

    async def discard(self, run_id: str, task_id: str, token: int) -> None:
        check_discard(run_id, task_id, token)
        path = self._path(run_id)
        async with self._run_lock(run_id):  # no put of the run lands between check and unlink
            try:
                await asyncio.to_thread(_discard, path, task_id, token)
            except OSError as exc:
                raise StreamCheckpointError(
                    run_id, "storage", f"cannot remove {path}: {exc}"
                ) from exc

    async def drop_thread(self, thread_id: str) -> None:
        """Remove every checkpoint of ``thread_id`` (after the thread was deleted, so no new
        put for it can pass the fence). Raises ``OSError`` on a storage failure."""
        # Taken before the scan: a put that passed the fence before the deletion is either
        # renamed in before the scan lists the directory or still registered here.
        runs = {run for run, thread in self._inflight.items() if thread == thread_id}
        runs.update(await asyncio.to_thread(_runs_of, self._dir, thread_id))
        for run_id in sorted(runs):
            async with self._run_lock(run_id):
                await asyncio.to_thread(_remove, self._dir / file_name(run_id), thread_id)

    def close(self) -> None:
        self._closed = True

    def _path(self, run_id: str) -> Path:
        try:
            check_id("run_id", run_id)
        except WakefulError as exc:
            raise StreamCheckpointError(str(run_id)[:40], "invalid", str(exc)) from exc
        if self._closed:
            raise StreamCheckpointError(run_id, "storage", "the store is closed")
        return self._dir / file_name(run_id)

    @asynccontextmanager
    async def _run_lock(self, run_id: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(run_id) or (asyncio.Lock(), 0)
        self._locks[run_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[run_id]
            if users == 1:
                del self._locks[run_id]
            else:
                self._locks[run_id] = (lock, users - 1)


# ------------------------------------------------------------------ blocking helpers


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _decode(path: Path, data: bytes) -> StreamCheckpoint | None:
    try:
        doc = _DECODER.decode(data)
    except msgspec.DecodeError as exc:
        logger.warning("%s: not a valid stream checkpoint: %s", path, exc)
        return None
    if doc.format != FORMAT or doc.version != VERSION:
        logger.warning("%s: unsupported stream checkpoint version %s", path, doc.version)
        return None
    return doc.checkpoint


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}{TMP_SUFFIX}")
    try:
        write_synced(tmp, data)
        os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def _remove(path: Path, only_thread: str | None) -> None:
    """Unlink ``path`` (if it still belongs to ``only_thread`` when given) and fsync."""
    if only_thread is not None:
        data = _read(path)
        found = _decode(path, data) if data is not None else None
        if found is None or found.thread_id != only_thread:
            return
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    fsync_dir(path.parent)


def _discard(path: Path, task_id: str, token: int) -> None:
    """Unlink ``path`` if it holds the checkpoint of turn ``task_id`` written under a token
    not above ``token``, and fsync."""
    data = _read(path)
    if data is None or not discards(_decode(path, data), task_id, token):
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    fsync_dir(path.parent)


def _runs_of(directory: Path, thread_id: str) -> list[str]:
    runs: list[str] = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:  # nobody ever stored a checkpoint there, or it was removed
        return runs
    for entry in entries:
        if not entry.name.startswith("run-") or not entry.name.endswith(".json"):
            continue
        data = _read(Path(entry.path))
        found = _decode(Path(entry.path), data) if data is not None else None
        if found is not None and found.thread_id == thread_id:
            runs.append(found.run_id)
    return runs


def remove_stray_temp_files(directory: Path) -> None:
    """Remove temp files a crashed put left behind (called while opening the store)."""
    removed = False
    for entry in os.scandir(directory):
        if entry.name.startswith(".") and entry.name.endswith(TMP_SUFFIX):
            os.unlink(entry.path)
            removed = True
    if removed:
        fsync_dir(directory)
