"""The chaos matrix, reduced: ``CHAOS_TRIALS`` trials (default 1) of every cell (fault kind
and store), each in child processes, each checked against the invariants (see
``tests/chaos/checks.py`` and ``docs/reliability.md``). A failure lists every violation
with the seed and the command that replays it. ``make chaos`` runs the full matrix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.harness import Stores
from tests.chaos.matrix import CELLS, cell_name, env_int, plan, replay_command
from tests.chaos.trials import run_trial
from tests.services import postgres_dsn

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stores() -> Iterator[Stores]:
    provisioned = Stores()
    try:
        yield provisioned
    finally:
        provisioned.close()


def cells() -> list[object]:
    return [
        pytest.param(cell, id=cell_name(cell), marks=[pytest.mark.postgres])
        if cell[1] == "postgres"
        else pytest.param(cell, id=cell_name(cell))
        for cell in CELLS
    ]


@pytest.mark.timeout(120 + 150 * env_int("CHAOS_TRIALS", 1))
@pytest.mark.parametrize("cell", cells())
def test_chaos_cell(cell: tuple[str, str], stores: Stores, tmp_path: Path) -> None:
    seeds = plan(cells=[cell]).seeds.get(cell)
    if not seeds:
        pytest.skip(f"{cell_name(cell)} is not selected (CHAOS_SEED or CHAOS_ONLY)")
    if cell[1] == "postgres":
        postgres_dsn()  # skips loudly, or fails under WAKEFUL_REQUIRE_SERVICES=1
    failures: list[str] = []
    for seed in seeds:
        result = run_trial(cell[0], cell[1], seed, stores, tmp_path)
        if result.violations:
            lines = [f"seed {seed} ({result.notes.get('fault', '')}):"]
            lines += [f"  {v.invariant}: {v.detail}" for v in result.violations]
            lines += [f"  replay: {replay_command(seed)}", f"  files: {result.directory}"]
            failures.append("\n".join(lines))
    assert not failures, f"{len(failures)} of {len(seeds)} trials failed:\n" + "\n".join(failures)
