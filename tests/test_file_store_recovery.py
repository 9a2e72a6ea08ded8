"""Opening a file store root: torn tails, corruption, snapshots and format versions."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import random
import tempfile
from pathlib import Path

import pytest

from tests.file_child import mixed_workload
from tests.file_support import LOG, line_spans, records_of, with_record, written_log
from wakeful.clock import ManualClock
from wakeful.errors import CorruptStore
from wakeful.store.file import open_file_store
from wakeful.store.file.codec import frame
from wakeful.store.file.snapshot import decode_state, encode_state
from wakeful.store.projection import State

pytestmark = pytest.mark.asyncio


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def in_memory_if_possible(fallback: Path) -> Path:
    """A directory on a RAM file system (where fsync costs nothing), else ``fallback``."""
    ram = Path("/dev/shm")
    return ram if ram.is_dir() and os.access(ram, os.W_OK) else fallback


def torn_files(root: Path) -> list[Path]:
    return sorted(root.glob(f"{LOG}.torn-*"))


@pytest.mark.slow
async def test_every_byte_prefix_opens_to_exactly_its_complete_records(tmp_path: Path) -> None:
    # One round of every kind, then small records, to keep the number of prefixes modest.
    clock = ManualClock()
    store = await open_file_store((tmp_path / "source").as_uri(), clock=clock)
    await mixed_workload(store, clock, rounds=1)
    claim = await store.claim("small", "h", 30)
    identity = await store.register_worker("w-small")
    for _ in range(12):
        await store.renew("small", claim.token, 30)
        await store.heartbeat(identity)
    await store.close()
    data = (tmp_path / "source" / LOG).read_bytes()
    spans = line_spans(data)
    records = records_of(data)
    assert len(records) >= 50 and len({type(r) for r in records}) == 18, "every record kind"
    states = []
    for k in range(len(records) + 1):
        expected = State()
        for record in records[:k]:
            expected.apply(record)
        states.append(expected)
    header_end = spans[0][1]
    logging.getLogger("wakeful.store.file").setLevel(logging.ERROR)  # one warning per prefix

    async def check(n: int, root: Path) -> None:
        for old in torn_files(root):
            old.unlink()
        (root / LOG).write_bytes(data[:n])
        complete = sum(1 for _, end in spans[1:] if end <= n)
        store = await open_file_store(root.as_uri())
        try:
            assert store._state == states[complete], f"prefix of {n} bytes"
        finally:
            await store.close()
        kept = spans[complete][1] if n >= header_end else header_end
        assert (root / LOG).read_bytes() == data[:kept], f"prefix of {n} bytes"
        cut_at = kept if n >= header_end else 0
        saved = {p.name: p.read_bytes() for p in torn_files(root)}
        expected = {f"{LOG}.torn-{cut_at}": data[cut_at:n]} if n > cut_at else {}
        assert saved == expected, f"prefix of {n} bytes: the cut bytes are kept"

    async def worker(k: int, lanes: int) -> None:
        root = scratch / f"prefix-{k}"
        root.mkdir()
        for n in range(k, len(data) + 1, lanes):
            await check(n, root)

    # Independent roots opened side by side: the fsyncs of one overlap the replay of another.
    # On a RAM file system if there is one: each of the ~14,000 torn opens makes three fsyncs
    # and a directory entry (keeping the cut bytes), which a shared disk turns into minutes.
    # What a crash leaves on a real disk is tested with SIGKILL in test_file_store_processes.
    with tempfile.TemporaryDirectory(dir=in_memory_if_possible(tmp_path)) as directory:
        scratch = Path(directory)
        await asyncio.gather(*(worker(k, 6) for k in range(6)))


async def test_a_torn_tail_is_truncated_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = await written_log(tmp_path)
    (tmp_path / LOG).write_bytes(data + b'{"c":"00000000","m":{"type":"clai')
    with caplog.at_level(logging.WARNING, logger="wakeful.store.file"):
        store = await open_file_store(tmp_path.as_uri())
        await store.close()
        store = await open_file_store(tmp_path.as_uri())
        await store.close()
    torn = [r for r in caplog.records if "torn append" in r.getMessage()]
    assert len(torn) == 1 and torn[0].name == "wakeful.store.file"
    kept = tmp_path / f"{LOG}.torn-{len(data)}"
    assert f"offset {len(data)}" in torn[0].getMessage() and str(kept) in torn[0].getMessage()
    assert "not acknowledged if the process crashed mid-write" in torn[0].getMessage()
    assert (tmp_path / LOG).read_bytes() == data
    assert kept.read_bytes() == b'{"c":"00000000","m":{"type":"clai'


async def test_a_flipped_byte_in_any_complete_record_fails_closed(tmp_path: Path) -> None:
    data = await written_log(tmp_path / "source")
    spans = line_spans(data)
    rng = random.Random(7)
    root = tmp_path / "corrupt"
    root.mkdir()
    for number, (start, end) in enumerate(spans, start=1):
        last = end - 1 if number == len(spans) else end  # the very last newline: see below
        for position in {start, end - 2, *(rng.randrange(start, last) for _ in range(3))}:
            corrupt = bytearray(data)
            corrupt[position] ^= 0x01
            (root / LOG).write_bytes(bytes(corrupt))
            before = sha256(root / LOG)
            with pytest.raises(CorruptStore) as failed:
                await open_file_store(root.as_uri())
            assert (failed.value.offset, failed.value.line) == (start, number), position
            assert failed.value.path == str(root / LOG)
            assert sha256(root / LOG) == before
    # A flipped final newline is indistinguishable from a torn append (documented).


async def test_corruption_before_a_torn_tail_changes_nothing(tmp_path: Path) -> None:
    data = await written_log(tmp_path)
    spans = line_spans(data)
    start, end = spans[5]
    corrupt = bytearray(data + b'{"c":"0')
    corrupt[start + (end - start) // 2] ^= 0x20
    (tmp_path / LOG).write_bytes(bytes(corrupt))
    before = sha256(tmp_path / LOG)
    with pytest.raises(CorruptStore, match="line 6") as failed:
        await open_file_store(tmp_path.as_uri())
    assert failed.value.offset == start
    assert sha256(tmp_path / LOG) == before, "not even the torn tail was truncated"
    assert "left unchanged" in str(failed.value)


async def test_a_record_that_does_not_apply_is_corruption(tmp_path: Path) -> None:
    data = await written_log(tmp_path)
    bogus = b'{"type":"renewed","thread_id":"nobody","token":1,"expires_at":"2026-01-01T00:00:00Z"}'
    (tmp_path / LOG).write_bytes(with_record(data, bogus))
    with pytest.raises(CorruptStore, match="does not apply") as failed:
        await open_file_store(tmp_path.as_uri())
    assert failed.value.offset == len(data)


async def test_an_unknown_format_version_is_refused(tmp_path: Path) -> None:
    data = await written_log(tmp_path)
    header_end = data.index(b"\n") + 1
    newer = frame(b'{"format":"wakeful.file-log","version":3,"generation":0}')
    (tmp_path / LOG).write_bytes(newer + data[header_end:])
    with pytest.raises(CorruptStore, match="version 3 is not supported"):
        await open_file_store(tmp_path.as_uri())


async def test_state_round_trips_through_its_json_exactly(tmp_path: Path) -> None:
    clock = ManualClock()
    store = await open_file_store(tmp_path.as_uri(), clock=clock)
    await mixed_workload(store, clock, rounds=3)
    body = encode_state(store._state)
    assert decode_state(body) == store._state
    assert encode_state(decode_state(body)) == body, "deterministic"
    json.loads(body)  # plain JSON
    await store.close()


async def test_a_snapshot_and_its_log_must_belong_together(tmp_path: Path) -> None:
    clock = ManualClock()
    store = await open_file_store(tmp_path.as_uri(), clock=clock)
    await mixed_workload(store, clock, rounds=1, tag="a")
    await store.compact()
    await mixed_workload(store, clock, rounds=1, tag="b")
    await store.compact()
    await store.close()
    log = (tmp_path / LOG).read_bytes()
    # a log two generations behind its snapshot: something was replaced by hand
    (tmp_path / LOG).write_bytes(frame(b'{"format":"wakeful.file-log","version":1,"generation":0}'))
    with pytest.raises(CorruptStore, match="generation"):
        await open_file_store(tmp_path.as_uri())
    (tmp_path / LOG).unlink()
    with pytest.raises(CorruptStore, match="missing"):
        await open_file_store(tmp_path.as_uri())
    (tmp_path / LOG).write_bytes(log)
    snapshot = bytearray((tmp_path / "snapshot.json").read_bytes())
    snapshot[-10] ^= 0x01
    (tmp_path / "snapshot.json").write_bytes(bytes(snapshot))
    before = sha256(tmp_path / "snapshot.json")
    with pytest.raises(CorruptStore) as failed:
        await open_file_store(tmp_path.as_uri())
    assert failed.value.path == str(tmp_path / "snapshot.json") and failed.value.line == 2
    assert sha256(tmp_path / "snapshot.json") == before
