"""The chained log: lost, repeated, reordered and foreign records, zero-filled and torn data,
and logs written before the chain (format version 1)."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from pathlib import Path

import msgspec
import pytest

from tests.file_child import mixed_workload
from tests.file_support import LOG, fingerprint, line_spans, written_log
from wakeful.clock import ManualClock
from wakeful.errors import CorruptStore, StoreUnavailable
from wakeful.records import Checkpoint, Commit, EventDraft
from wakeful.store.file import open_file_store
from wakeful.store.file.snapshot import decode_state, encode_state
from wakeful.store.projection import Mutation, State

pytestmark = pytest.mark.asyncio

SNAPSHOT = "snapshot.json"
FIXTURES = Path(__file__).parent / "fixtures" / "file_log_v1"


def kind(line: bytes) -> str:
    """The mutation type of a record line (either log format)."""
    body = json.loads(line)["m"]
    return str(body.get("mutation", body)["type"])


def first_of(data: bytes, wanted: str, after: int = 0) -> int:
    """The index in ``line_spans(data)`` of the first record line of type ``wanted`` past
    line index ``after``."""
    spans = line_spans(data)
    return next(
        i for i in range(max(after, 1), len(spans)) if kind(data[slice(*spans[i])]) == wanted
    )


async def refused(root: Path) -> CorruptStore:
    """Open ``root``, expecting ``CorruptStore`` and not a single changed byte."""
    before = fingerprint(root)
    with pytest.raises(CorruptStore) as failed:
        await open_file_store(root.as_uri())
    assert fingerprint(root) == before, "a refused open changes nothing"
    return failed.value


def torn_files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.glob(f"{LOG}.torn-*"))}


# ---------------------------------------------------------------- records out of place


async def test_a_deleted_middle_record_is_refused(tmp_path: Path) -> None:
    data = await written_log(tmp_path)
    index = first_of(data, "renewed", after=10)  # replays fine without it: only the chain tells
    start, end = line_spans(data)[index]
    (tmp_path / LOG).write_bytes(data[:start] + data[end:])
    error = await refused(tmp_path)
    assert (error.offset, error.line) == (start, index + 1)
    assert f"record {index} is missing" in error.detail


async def test_a_duplicated_record_is_refused(tmp_path: Path) -> None:
    data = await written_log(tmp_path)
    start, end = line_spans(data)[first_of(data, "committed")]
    (tmp_path / LOG).write_bytes(data[:end] + data[start:end] + data[end:])
    error = await refused(tmp_path)
    assert error.offset == end and "repeats an earlier record" in error.detail


async def test_swapped_records_are_refused(tmp_path: Path) -> None:
    data = await written_log(tmp_path)
    index = first_of(data, "enqueued")  # two enqueues in a row: either order applies
    assert kind(data[slice(*line_spans(data)[index + 1])]) == "enqueued"
    (a, b), (_, c) = line_spans(data)[index], line_spans(data)[index + 1]
    (tmp_path / LOG).write_bytes(data[:a] + data[b:c] + data[a:b] + data[c:])
    error = await refused(tmp_path)
    assert error.offset == a and f"record {index} is missing" in error.detail


async def test_a_record_from_another_log_is_refused(tmp_path: Path) -> None:
    ours = await written_log(tmp_path / "ours")
    clock = ManualClock()
    clock.advance(5)  # the same work at another time: records that apply to either log
    store = await open_file_store((tmp_path / "theirs").as_uri(), clock=clock)
    await mixed_workload(store, clock, rounds=2)
    await store.close()
    theirs = (tmp_path / "theirs" / LOG).read_bytes()
    index = first_of(ours, "renewed")
    (a, b), (c, d) = line_spans(ours)[index], line_spans(theirs)[index]
    assert kind(theirs[c:d]) == "renewed" and ours[a:b] != theirs[c:d]
    (tmp_path / "ours" / LOG).write_bytes(ours[:a] + theirs[c:d] + ours[b:])
    error = await refused(tmp_path / "ours")
    assert error.offset == a and f"does not continue record {index - 1}" in error.detail


async def test_the_first_record_after_a_compaction_continues_its_snapshot(
    tmp_path: Path,
) -> None:
    roots = []
    for tag in ("x", "y"):
        root = tmp_path / tag
        clock = ManualClock()
        store = await open_file_store(root.as_uri(), clock=clock, compact_bytes=None)
        await mixed_workload(store, clock, rounds=1, tag=tag)
        await store.compact()
        await mixed_workload(store, clock, rounds=1, tag=tag + "2")
        await store.close()
        roots.append(root)
    # The same generation from another root: each file is valid alone, not together.
    shutil.copy(roots[1] / SNAPSHOT, roots[0] / SNAPSHOT)
    error = await refused(roots[0])
    assert error.path == str(roots[0] / LOG) and error.line == 2
    assert "does not continue the snapshot" in error.detail


# ---------------------------------------------------------------- zero-filled data


async def test_a_zero_filled_log_is_refused(tmp_path: Path) -> None:
    data = await written_log(tmp_path, rounds=4)
    (tmp_path / LOG).write_bytes(bytes(len(data)))
    error = await refused(tmp_path)
    assert (error.offset, error.line) == (0, 1) and "all NUL bytes" in error.detail


async def test_a_zero_filled_log_after_a_compaction_is_refused(tmp_path: Path) -> None:
    clock = ManualClock()
    store = await open_file_store(tmp_path.as_uri(), clock=clock, compact_bytes=None)
    await mixed_workload(store, clock, rounds=1, tag="a")
    await store.compact()
    await mixed_workload(store, clock, rounds=1, tag="b")
    await store.close()
    size = (tmp_path / LOG).stat().st_size
    (tmp_path / LOG).write_bytes(bytes(size))
    error = await refused(tmp_path)
    assert (error.offset, error.line) == (0, 1)


async def test_zeroed_last_4_kib_are_refused(tmp_path: Path) -> None:
    data = await written_log(tmp_path, rounds=4)  # one commit per write: sequential calls
    zero_from = len(data) - 4096
    spans = line_spans(data)
    index = next(i for i, (a, b) in enumerate(spans) if a <= zero_from < b)
    start, _ = spans[index]
    assert zero_from - start > len(b'{"c":"12345678","m":{"batch_end":123456,'), (
        "the zeroed run begins after its record's batch_end (else the tail cannot be bounded)"
    )
    assert len(spans) - index > 3, "several acknowledged records are wiped"
    (tmp_path / LOG).write_bytes(data[:zero_from] + bytes(4096))
    error = await refused(tmp_path)
    assert (error.offset, error.line) == (start, index + 1)
    assert "reaching past the end of the write it began" in error.detail


async def test_a_zero_filled_or_cut_snapshot_is_refused(tmp_path: Path) -> None:
    clock = ManualClock()
    store = await open_file_store(tmp_path.as_uri(), clock=clock, compact_bytes=None)
    await mixed_workload(store, clock, rounds=1)
    await store.compact()
    await store.close()
    snapshot = (tmp_path / SNAPSHOT).read_bytes()
    for damaged in (
        bytes(len(snapshot)),  # wholly zero-filled
        snapshot[:-100] + bytes(100),  # the end zeroed, final newline included
        snapshot[: len(snapshot) // 2],  # cut: a snapshot is never torn (renamed in whole)
    ):
        (tmp_path / SNAPSHOT).write_bytes(damaged)
        error = await refused(tmp_path)
        assert error.path == str(tmp_path / SNAPSHOT)


# ---------------------------------------------------------------- torn tails


async def test_a_torn_tail_is_cut_only_after_it_was_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = await written_log(tmp_path)
    start, end = line_spans(data)[-1]
    cut = start + (end - start) // 2  # the last record, zeroed from its middle on
    (tmp_path / LOG).write_bytes(data[:cut] + bytes(end - cut))
    with caplog.at_level(logging.WARNING, logger="wakeful.store.file"):
        store = await open_file_store(tmp_path.as_uri())
    await store.close()
    assert (tmp_path / LOG).read_bytes() == data[:start]
    assert torn_files(tmp_path) == {f"{LOG}.torn-{start}": data[start:cut] + bytes(end - cut)}
    (message,) = [r.getMessage() for r in caplog.records if "torn" in r.getMessage()]
    assert "not acknowledged if the process crashed mid-write" in message
    assert "never acknowledged" not in message and f"{LOG}.torn-{start}" in message


async def test_unwritten_blocks_after_the_last_record_are_a_torn_tail(tmp_path: Path) -> None:
    # What a power loss can leave: the file was extended, its new blocks never written.
    data = await written_log(tmp_path)
    (tmp_path / LOG).write_bytes(data + bytes(4096))
    store = await open_file_store(tmp_path.as_uri())
    await store.close()
    assert (tmp_path / LOG).read_bytes() == data
    assert torn_files(tmp_path) == {f"{LOG}.torn-{len(data)}": bytes(4096)}


async def test_a_tail_that_does_not_begin_like_a_record_is_refused(tmp_path: Path) -> None:
    data = await written_log(tmp_path)
    (tmp_path / LOG).write_bytes(data + b"garbage")
    error = await refused(tmp_path)
    assert error.offset == len(data) and "do not begin like a record" in error.detail


async def test_kept_torn_bytes_are_never_overwritten(tmp_path: Path) -> None:
    data = await written_log(tmp_path)
    first, second = data + b'{"c":"0', data + b'{"c":"1'
    for torn in (first, first, second):
        (tmp_path / LOG).write_bytes(torn)
        store = await open_file_store(tmp_path.as_uri())
        await store.close()
    assert torn_files(tmp_path) == {
        f"{LOG}.torn-{len(data)}": b'{"c":"0',  # the same bytes again: the same file
        f"{LOG}.torn-{len(data)}-1": b'{"c":"1',
    }


# ---------------------------------------------------------------- writes


async def commit_concurrently(root: Path, count: int, pad: int) -> None:
    clock = ManualClock()
    store = await open_file_store(root.as_uri(), clock=clock, compact_bytes=None)
    claims = [await store.claim(f"t{k}", "h", 30) for k in range(count)]

    async def one(k: int) -> None:
        checkpoint = Checkpoint(
            id=f"cp-{k}",
            parent=None,
            run_id="r",
            status="running",
            state={"pad": "x" * pad},
            created_at=clock.now(),
        )
        await store.commit(
            f"t{k}",
            Commit(token=claims[k].token, checkpoint=checkpoint, events=(EventDraft(type="e"),)),
        )

    before = store.stats
    await asyncio.gather(*(one(k) for k in range(count)))
    assert store.stats.appends - before.appends == 1, "one batch"
    await store.close()


def batch_ends(data: bytes) -> list[int]:
    return [json.loads(line)["m"]["batch_end"] for line in data.splitlines()[1:]]


async def test_the_records_of_one_write_name_its_end(tmp_path: Path) -> None:
    await commit_concurrently(tmp_path, 16, pad=50)
    data = (tmp_path / LOG).read_bytes()
    spans = line_spans(data)
    assert batch_ends(data)[-16:] == [len(data)] * 16
    # Cut inside the write, even past several of its records: a torn append.
    cut = spans[-3][0] + 60
    (tmp_path / LOG).write_bytes(data[: spans[-16][0] + 60] + bytes(cut - spans[-16][0] - 60))
    store = await open_file_store(tmp_path.as_uri())
    await store.close()
    assert (tmp_path / LOG).read_bytes() == data[: spans[-16][0]]


async def test_a_batch_larger_than_the_largest_write_is_written_in_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("wakeful.store.file.chain.MAX_WRITE_BYTES", 2000)
    await commit_concurrently(tmp_path, 8, pad=300)
    data = (tmp_path / LOG).read_bytes()
    spans, ends = line_spans(data), batch_ends(data)
    writes = sorted(set(ends[-8:]))
    assert len(writes) >= 3 and writes[-1] == len(data)
    starts = [spans[-8][0], *writes[:-1]]
    assert all(0 < end - start <= 2000 for start, end in zip(starts, writes, strict=True))
    assert all(end in {b for _, b in spans} for end in writes), "writes end on a record"
    store = await open_file_store(tmp_path.as_uri())
    assert {t for t in store._state.threads if t.startswith("t")} == {f"t{k}" for k in range(8)}
    await store.close()


async def test_a_record_larger_than_the_largest_write_is_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("wakeful.store.file.chain.MAX_WRITE_BYTES", 2000)
    store = await open_file_store(tmp_path.as_uri(), compact_bytes=None)
    claim = await store.claim("t", "h", 30)
    checkpoint = Checkpoint(
        id="cp",
        parent=None,
        run_id="r",
        status="running",
        state={"x": "y" * 3000},
        created_at=store.now(),
    )
    with pytest.raises(StoreUnavailable, match="exceeds the largest write"):
        await store.commit("t", Commit(token=claim.token, checkpoint=checkpoint))
    await store.close()
    store = await open_file_store(tmp_path.as_uri())
    snapshot = await store.read("t")
    assert snapshot is not None and snapshot.version == 0, "nothing of it was kept"
    await store.close()


# ---------------------------------------------------------------- version 1 logs


def version_1_state(root: Path) -> State:
    """The state a version 1 root holds, decoded independently of the store's reader."""
    state = State()
    if (root / SNAPSHOT).exists():
        line = (root / SNAPSHOT).read_bytes().splitlines()[1]
        state = decode_state(msgspec.json.encode(json.loads(line)["m"]))
    decoder = msgspec.json.Decoder(Mutation)
    for line in (root / LOG).read_bytes().splitlines()[1:]:
        state.apply(decoder.decode(msgspec.json.encode(json.loads(line)["m"])))
    return state


def headers(root: Path) -> tuple[dict[str, int], dict[str, int] | None]:
    log = json.loads((root / LOG).read_bytes().splitlines()[0])["m"]
    snap = None
    if (root / SNAPSHOT).exists():
        snap = json.loads((root / SNAPSHOT).read_bytes().splitlines()[0])["m"]
    return log, snap


@pytest.mark.parametrize("name", ["fresh", "compacted"])
async def test_a_version_1_root_opens_and_is_upgraded(tmp_path: Path, name: str) -> None:
    root = tmp_path / name
    shutil.copytree(FIXTURES / name, root)
    generation = headers(root)[0]["generation"]
    assert headers(root)[0]["version"] == 1, "the fixture is today's format"
    expected = version_1_state(root)
    clock = ManualClock()
    store = await open_file_store(root.as_uri(), clock=clock, compact_bytes=None)
    assert store._state == expected
    log, snap = headers(root)
    assert (log["version"], log["generation"]) == (2, generation + 1)
    assert snap is not None and snap["generation"] == generation + 1
    await mixed_workload(store, clock, rounds=1, tag="after")  # appended to the chained log
    expected = decode_state(encode_state(store._state))
    await store.close()
    store = await open_file_store(root.as_uri(), compact_bytes=None)
    assert store._state == expected
    await store.close()
    assert headers(root)[0]["generation"] == generation + 1, "upgraded once"


async def test_a_version_1_log_with_a_torn_tail_keeps_it_and_upgrades(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "fresh", tmp_path / "root")
    root = tmp_path / "root"
    data = (root / LOG).read_bytes()
    start, end = line_spans(data)[-1]
    (root / LOG).write_bytes(data[: end - 7])
    (root / "full").mkdir()
    (root / "full" / LOG).write_bytes(data[:start])
    expected = version_1_state(root / "full")
    shutil.rmtree(root / "full")
    store = await open_file_store(root.as_uri())
    assert store._state == expected
    await store.close()
    assert torn_files(root) == {f"{LOG}.torn-{start}": data[start : end - 7]}
    assert headers(root)[0]["version"] == 2
