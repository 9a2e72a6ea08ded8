"""``make bench --merge`` keeps each module's machine: a section measured on another CPU than
the page's says so, in its heading and in the targets table (rendering only, nothing timed)."""

from __future__ import annotations

from typing import Any

from benchmarks.__main__ import Outcome, merged
from benchmarks.common import Result
from benchmarks.report import render_markdown


def _machine(cpu: str, fsync_ms: float, commit: str) -> dict[str, Any]:
    return {"cpu_model": cpu, "fsync": {"median_ms": fsync_ms}, "git": {"commit": commit}}


def _result(benchmark: str, value: float) -> Result:
    return Result(
        benchmark=benchmark, name="commit, 8 concurrent writers", value=value, unit="/s",
        anchor="SqliteSaver.put", anchor_value=1000.0, target=3.0, samples=(value,),
    )  # fmt: skip


def _earlier() -> dict[str, Any]:
    return {
        "generated": "2026-12-03T20:00:00+0000",
        "seconds": 10.0,
        "rounds": 3,
        "machine": _machine("Intel(R) Xeon(R) Processor", 0.188, "aaaaaaa"),
        "modules": {
            "file_store": {"status": "ok", "seconds": 5.0, "detail": ""},
            "sqlite_store": {"status": "ok", "seconds": 5.0, "detail": ""},
        },
        "results": [
            _result("file_store", 2500.0).to_json(),
            _result("sqlite_store", 2700.0).to_json(),
        ],
    }


def test_a_module_merged_from_another_machine_is_marked_and_the_rest_keep_theirs() -> None:
    here = _machine("AMD EPYC", 0.136, "bbbbbbb")
    outcome = Outcome("sqlite_store", "ok", 20.0, results=(_result("sqlite_store", 1800.0),))
    data = merged(_earlier(), [outcome], list(outcome.results), "2026-12-04T01:55:06+0000", here)

    assert data["machine"]["cpu_model"] == "Intel(R) Xeon(R) Processor"  # the page's machine
    assert data["modules"]["file_store"]["machine"]["cpu_model"] == "Intel(R) Xeon(R) Processor"
    assert data["modules"]["file_store"]["generated"] == "2026-12-03T20:00:00+0000"
    assert data["modules"]["sqlite_store"]["machine"] == {
        "cpu_model": "AMD EPYC", "fsync_median_ms": 0.136, "commit": "bbbbbbb",
    }  # fmt: skip
    assert [r["value"] for r in data["results"]] == [2500.0, 1800.0]

    page = render_markdown(data, None)
    assert "| sqlite_store (another machine) | commit, 8 concurrent writers | 1,800 /s" in page
    assert "| file_store | commit, 8 concurrent writers | 2,500 /s" in page
    assert "### sqlite_store (20 s) on another machine: AMD EPYC, fsync median 0.136 ms" in page
    assert "### file_store (5 s), measured 2026-12-03T20:00:00+0000\n" in page


def test_a_module_rerun_on_the_pages_machine_is_not_marked() -> None:
    here = _machine("Intel(R) Xeon(R) Processor", 0.2, "ccccccc")
    outcome = Outcome("sqlite_store", "ok", 20.0, results=(_result("sqlite_store", 2900.0),))
    data = merged(_earlier(), [outcome], list(outcome.results), "2026-12-04T01:55:06+0000", here)

    page = render_markdown(data, None)
    assert "another machine" not in page
    assert "| sqlite_store | commit, 8 concurrent writers | 2,900 /s" in page
