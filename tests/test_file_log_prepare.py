"""The log's appends prepared apart from their write: the chained lines match the layout
``chain`` documents, preparing changes nothing, and a stale preparation is never written."""

from __future__ import annotations

import threading
from pathlib import Path

import msgspec
import pytest

from wakeful.records import Commit, EventDraft
from wakeful.store.file import open_file_store
from wakeful.store.file.chain import GENESIS, ChainPosition, encode_write, link
from wakeful.store.file.codec import frame, frame_parts, unframe
from wakeful.store.file.log import LogWriter, create_log

pytestmark = pytest.mark.asyncio


def reference(
    bodies: list[bytes], start: int, position: ChainPosition
) -> tuple[bytes, ChainPosition]:
    """The same write built the slow way, from the documented layout: an envelope object with
    keys in the stated order, framed, each line linked to the one before; the end offset is
    found by iterating until the lines' own length agrees with it."""
    end = start
    while True:
        lines, prev = [], position.link
        for seq, body in enumerate(bodies, start=position.seq + 1):
            envelope = {"batch_end": end, "seq": seq, "prev": prev, "mutation": msgspec.Raw(body)}
            line = frame(msgspec.json.encode(envelope))
            lines.append(line)
            prev = link(line)
        data = b"".join(lines)
        if start + len(data) == end:
            return data, ChainPosition(position.seq + len(bodies), prev)
        end = start + len(data)


@pytest.mark.parametrize("count", [1, 2, 3, 12])
@pytest.mark.parametrize("start", [0, 57, 9_400, 999_000, 99_999_990])
@pytest.mark.parametrize("seq", [0, 8, 97, 12_345])
async def test_a_write_matches_the_documented_layout(count: int, start: int, seq: int) -> None:
    bodies = [
        msgspec.json.encode({"type": "x", "n": i, "pad": "p" * (i * 37)}) for i in range(count)
    ]
    position = ChainPosition(seq, link(b"before %d" % seq) if seq else GENESIS)
    assert encode_write(bodies, start, position) == reference(bodies, start, position)


@pytest.mark.parametrize(
    "parts", [[b"{}"], [b'{"a":', b"1", b"}"], [b"", b'{"b":"x"}', b""], [b"[", b"1" * 5000, b"]"]]
)
async def test_framing_parts_is_framing_their_join(parts: list[bytes]) -> None:
    line = frame_parts(*parts)
    assert line == frame(b"".join(parts))
    assert unframe(line[:-1]) == b"".join(parts)


def writer_at(tmp_path: Path) -> LogWriter:
    size = create_log(tmp_path, 0)
    return LogWriter.open(tmp_path / "commits.ndjson", size, 0, ChainPosition(0, GENESIS))


async def test_preparing_changes_nothing_and_a_stale_preparation_is_refused(
    tmp_path: Path,
) -> None:
    writer = writer_at(tmp_path)
    try:
        size, position = writer.size, writer.position
        stale = writer.prepare([b'{"type":"a"}'])
        assert (writer.size, writer.position) == (size, position)
        assert stale.start == size and stale.end == size + len(b"".join(stale.writes))
        fresh = writer.prepare([b'{"type":"b"}'])
        assert writer.write(fresh) == fresh.end - size
        assert (writer.size, writer.position) == (fresh.end, fresh.position)
        on_disk = (tmp_path / "commits.ndjson").read_bytes()
        with pytest.raises(ValueError, match="prepared before another append"):
            writer.write(stale)
        assert (tmp_path / "commits.ndjson").read_bytes() == on_disk
        assert (writer.size, writer.position) == (fresh.end, fresh.position)
    finally:
        writer.close()


async def test_the_store_chains_on_the_loop_and_writes_on_its_io_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: dict[str, set[str]] = {"prepare": set(), "write": set()}
    prepare, write = LogWriter.prepare, LogWriter.write

    def spy_prepare(self: LogWriter, bodies: list[bytes]) -> object:
        threads["prepare"].add(threading.current_thread().name)
        return prepare(self, bodies)

    def spy_write(self: LogWriter, prepared: object) -> int:
        threads["write"].add(threading.current_thread().name)
        return write(self, prepared)  # type: ignore[arg-type]

    monkeypatch.setattr(LogWriter, "prepare", spy_prepare)
    monkeypatch.setattr(LogWriter, "write", spy_write)
    store = await open_file_store(tmp_path.as_uri())
    claim = await store.claim("t1", "h", 60)
    await store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="x"),)))
    await store.close()
    assert threads["prepare"] == {threading.current_thread().name}
    assert len(threads["write"]) == 1 and threads["write"] != threads["prepare"]
    reopened = await open_file_store(tmp_path.as_uri())
    snap = await reopened.read("t1")
    assert snap is not None and snap.version == 1
    await reopened.close()
