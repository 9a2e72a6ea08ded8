"""A property of the file log under damage. For random logs written through the real store
(concurrent commits, so writes of several records, and sometimes a compaction first), each
single-record deletion, duplication and swap, zero-filled prefixes, infixes and suffixes, and
cuts: opening either refuses with ``CorruptStore`` and changes no byte of any file, or (a
torn final record only) opens with exactly the records before the damage, the log cut back
to them and the cut bytes kept in ``commits.ndjson.torn-<offset>``."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.file_support import LOG, fingerprint, line_spans, records_of
from wakeful.clock import ManualClock
from wakeful.errors import CorruptStore
from wakeful.records import Commit, EventDraft
from wakeful.store.file import open_file_store
from wakeful.store.file.snapshot import read_snapshot
from wakeful.store.projection import Mutation, State

SNAPSHOT = "snapshot.json"
THREADS = 3


@dataclass(frozen=True)
class Written:
    """An undamaged root: its log, its snapshot (if a compaction ran) and what they hold."""

    log: bytes
    snapshot: bytes | None
    records: list[Mutation]

    @property
    def spans(self) -> list[tuple[int, int]]:
        return line_spans(self.log)

    def state_after(self, count: int, root: Path) -> State:
        """The snapshot plus the first ``count`` records."""
        state = read_snapshot(root / SNAPSHOT).state if self.snapshot is not None else State()
        for record in self.records[:count]:
            state.apply(record)
        return state


async def write_root(root: Path, groups: list[list[int]], compact_after: int | None) -> Written:
    """Commit ``groups`` in order, each group's commits concurrently (one per thread, an event
    padded to the given size), compacting after group ``compact_after``."""
    clock = ManualClock()
    store = await open_file_store(root.as_uri(), clock=clock, compact_bytes=None)
    claims = [await store.claim(f"t{k}", "h", 3600) for k in range(THREADS)]

    async def commit(k: int, pad: int) -> None:
        event = EventDraft(type="e", data={"pad": "x" * pad})
        await store.commit(f"t{k}", Commit(token=claims[k].token, events=(event,)))

    for n, group in enumerate(groups):
        await asyncio.gather(*(commit(k, pad) for k, pad in enumerate(group)))
        if n == compact_after:
            await store.compact()
    await store.close()
    log = (root / LOG).read_bytes()
    snapshot = (root / SNAPSHOT).read_bytes() if (root / SNAPSHOT).exists() else None
    return Written(log, snapshot, records_of(log))


def record_damage(written: Written) -> Iterator[tuple[str, bytes]]:
    """Every single-record deletion, duplication and swap of neighbours."""
    data, spans = written.log, written.spans
    for i in range(1, len(spans)):
        a, b = spans[i]
        yield f"delete record {i}", data[:a] + data[b:]
        yield f"duplicate record {i}", data[:b] + data[a:b] + data[b:]
        if i + 1 < len(spans):
            _, c = spans[i + 1]
            yield f"swap records {i} and {i + 1}", data[:a] + data[b:c] + data[a:b] + data[c:]


def zero(data: bytes, start: int, end: int) -> bytes:
    return data[:start] + bytes(end - start) + data[end:]


def reset(root: Path, written: Written, damaged: bytes) -> dict[str, str]:
    """Make ``root`` the damaged root (nothing else in it); returns its fingerprint."""
    for path in root.iterdir():
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    if written.snapshot is not None:
        (root / SNAPSHOT).write_bytes(written.snapshot)
    (root / LOG).write_bytes(damaged)
    return fingerprint(root)


def kept_files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in root.glob(f"{LOG}.torn-*")}


async def check(root: Path, written: Written, what: str, damaged: bytes) -> str:
    """Open the damaged root and check the outcome; returns ``refused`` or ``opened``."""
    before = reset(root, written, damaged)
    try:
        store = await open_file_store(root.as_uri(), compact_bytes=None)
    except CorruptStore:
        assert fingerprint(root) == before, f"{what}: a refused open changed files"
        return "refused"
    state = store._state
    await store.close()
    data, spans = written.log, written.spans
    header_end = spans[0][1]
    if damaged[:header_end] != data[:header_end]:
        # Only a log that is the beginning of its header (a cut) may be started again.
        assert data.startswith(damaged) and len(damaged) < header_end, f"{what}: opened"
        intact, end = 0, 0
        assert (root / LOG).read_bytes() == data[:header_end], what
    else:
        intact = max(i for i in range(len(spans)) if damaged[: spans[i][1]] == data[: spans[i][1]])
        end = spans[intact][1]
        assert (root / LOG).read_bytes() == data[:end], f"{what}: the log is cut to the damage"
    tail = damaged[end:]
    assert b"\n" not in tail, f"{what}: opened though a complete line follows the damage"
    assert state == written.state_after(intact, root), f"{what}: not the intact records"
    assert kept_files(root) == ({f"{LOG}.torn-{end}": tail} if tail else {}), what
    if tail and intact + 1 < len(spans):
        line = data[slice(*spans[intact + 1])]
        named = line.index(b',"seq":') + 1  # the bytes up to the end of its batch_end
        if tail[:named] == line[:named]:
            batch_end = json.loads(line)["m"]["batch_end"]
            assert len(damaged) <= batch_end, f"{what}: a tail past its own write was accepted"
    return "opened"


groups_strategy = st.lists(
    st.lists(st.integers(0, 300), min_size=1, max_size=THREADS), min_size=2, max_size=5
)


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(groups=groups_strategy, compact=st.booleans(), data=st.data())
def test_damage_is_refused_unchanged_or_a_torn_tail_is_cut(
    tmp_path_factory: pytest.TempPathFactory,
    groups: list[list[int]],
    compact: bool,
    data: st.DataObject,
) -> None:
    base = tmp_path_factory.mktemp("damage")
    logging.getLogger("wakeful.store.file").setLevel(logging.ERROR)  # torn-tail warnings

    async def run() -> None:
        written = await write_root(base / "source", groups, 0 if compact else None)
        size = len(written.log)
        damages = list(record_damage(written))
        for _ in range(2):
            p = data.draw(st.integers(1, size), label="zero-filled prefix")
            a = data.draw(st.integers(1, size - 2), label="infix start")
            b = data.draw(st.integers(a + 1, size - 1), label="infix end")
            s = data.draw(st.integers(0, size - 1), label="zero-filled suffix")
            damages += [
                (f"zero [0, {p})", zero(written.log, 0, p)),
                (f"zero [{a}, {b})", zero(written.log, a, b)),
                (f"zero [{s}, end)", zero(written.log, s, size)),
            ]
        cuts = data.draw(st.lists(st.integers(0, size - 1), min_size=3, max_size=3), label="cuts")
        root = base / "damaged"
        root.mkdir()
        for what, damaged in damages:
            await check(root, written, what, damaged)
        for cut in cuts:
            outcome = await check(root, written, f"cut at {cut}", written.log[:cut])
            assert outcome == "opened", f"cut at {cut}: a cut is always a torn append"

    asyncio.run(run())
