"""The result record every benchmark module returns, and small helpers they share.

Each module's ``main(argv) -> list[Result]`` prints its own table and returns its figures;
``python -m benchmarks`` collects them (one subprocess per module), judges each against its
target and renders ``docs/benchmarks.md``.

A result compares ``value`` with an anchor: another measurement made in the same run (a
LangGraph saver, a queue library, the disk's raw rate, our own sequential rate) or a fixed
limit. ``ratio`` is ``value / anchor_value``; with a ``target`` the result PASSes when the
ratio is at least the target (``higher_is_better``) or at most the target (lower is better).
A result without an anchor or target is a figure only. ``skipped`` says why a measurement or
its anchor could not be taken (an optional package is not installed): reported, never a
failure.
"""

from __future__ import annotations

import argparse
import statistics
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from wakeful.records import Checkpoint

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
"""The server the PostgreSQL benchmarks use (``--dsn``): a database they may create others
from, as a role allowed to."""


@dataclass(frozen=True)
class Result:
    benchmark: str
    """The module that measured it (``sqlite_store``)."""
    name: str
    """What was measured (``commit, sequential``)."""
    value: float | None
    """The median of ``samples``; None when skipped."""
    unit: str
    higher_is_better: bool = True
    anchor: str | None = None
    """What ``value`` is compared with (``LangGraph SqliteSaver.put, 1 thread``, ``limit``)."""
    anchor_value: float | None = None
    target: float | None = None
    """The ratio ``value / anchor_value`` to reach (or stay under when lower is better)."""
    samples: tuple[float, ...] = ()
    """One value per repeat (round)."""
    note: str = ""
    skipped: str | None = None

    @property
    def ratio(self) -> float | None:
        if self.value is None or self.anchor_value is None or self.anchor_value == 0:
            return None
        return self.value / self.anchor_value

    @property
    def verdict(self) -> str:
        """PASS / MISS against the target, SKIP when it could not be judged, '' without one."""
        if self.skipped is not None:
            return "SKIP"
        if self.target is None:
            return ""
        ratio = self.ratio
        if ratio is None:
            return "SKIP"
        met = ratio >= self.target if self.higher_is_better else ratio <= self.target
        return "PASS" if met else "MISS"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["samples"] = list(self.samples)
        data["ratio"] = self.ratio
        data["verdict"] = self.verdict
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Result:
        fields = {k: v for k, v in data.items() if k not in ("ratio", "verdict")}
        fields["samples"] = tuple(fields.get("samples") or ())
        return cls(**fields)


@dataclass
class Collector:
    """Collects one module's results: ``results.add(name, samples, unit, ...)``."""

    benchmark: str
    results: list[Result] = field(default_factory=list)

    def add(
        self,
        name: str,
        samples: float | Iterable[float],
        unit: str,
        *,
        higher_is_better: bool = True,
        anchor: str | None = None,
        anchor_samples: float | Iterable[float] | None = None,
        target: float | None = None,
        note: str = "",
        skipped: str | None = None,
    ) -> Result:
        """Record the median of ``samples`` (a number is one sample). An ``anchor`` named
        without ``anchor_samples`` means the anchor could not be measured: the result is
        recorded as skipped (with ``skipped`` as the reason) unless it has no target."""
        values = _samples(samples)
        anchor_values = _samples(anchor_samples) if anchor_samples is not None else ()
        if anchor is not None and not anchor_values and target is not None and skipped is None:
            skipped = f"{anchor}: not measured"
        result = Result(
            benchmark=self.benchmark,
            name=name,
            value=statistics.median(values) if values else None,
            unit=unit,
            higher_is_better=higher_is_better,
            anchor=anchor,
            anchor_value=statistics.median(anchor_values) if anchor_values else None,
            target=target,
            samples=values,
            note=note,
            skipped=skipped,
        )
        self.results.append(result)
        return result

    def skip(self, name: str, unit: str, reason: str, *, anchor: str | None = None) -> Result:
        """A measurement that could not be taken at all."""
        result = Result(self.benchmark, name, None, unit, anchor=anchor, skipped=reason)
        self.results.append(result)
        return result


def _samples(samples: float | Iterable[float]) -> tuple[float, ...]:
    if isinstance(samples, int | float):
        return (float(samples),)
    return tuple(float(s) for s in samples)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def rounds_argument(parser: argparse.ArgumentParser, default: int = 3) -> None:
    parser.add_argument(
        "--rounds", type=int, default=default, help="repeats of each measurement (medians)"
    )


def format_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    magnitude = abs(value)
    if magnitude >= 100:
        text = f"{value:,.0f}"
    elif magnitude >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return f"{text} {unit}".strip()


def format_ratio(result: Result) -> str:
    ratio = result.ratio
    return "-" if ratio is None else f"{ratio:.2f}x"


def format_target(result: Result) -> str:
    if result.target is None:
        return "-"
    return f"{'>=' if result.higher_is_better else '<='} {result.target:g}x"


@dataclass
class Database:
    """A scratch PostgreSQL database ``name`` on the server of ``admin_dsn``:
    ``Database(dsn, name).create()`` (dropping any leftover first), ``.dsn``, ``.drop()``."""

    admin_dsn: str
    name: str

    def create(self) -> Database:
        import psycopg
        from psycopg import sql

        self.drop()
        with psycopg.connect(self.admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
        return self

    def drop(self) -> None:
        import psycopg
        from psycopg import sql

        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
        with psycopg.connect(self.admin_dsn, autocommit=True) as admin:
            admin.execute(drop.format(sql.Identifier(self.name)))

    @property
    def dsn(self) -> str:
        """The database as a ``postgresql://`` URL (what ``open_store`` and asyncpg take)."""
        import psycopg

        info = psycopg.conninfo.conninfo_to_dict(self.admin_dsn)
        user = quote(str(info.get("user", "postgres")), safe="")
        if info.get("password"):
            user += ":" + quote(str(info["password"]), safe="")
        host = info.get("host", "127.0.0.1")
        port = info.get("port", 5432)
        return f"postgresql://{user}@{host}:{port}/{self.name}"


def payload() -> dict[str, Any]:
    """About 1.5 kB of JSON state: a short conversation (the store benchmarks' payload)."""
    return {
        "messages": [
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * 12}
            for i in range(10)
        ],
        "step": 3,
        "flags": {"approved": True, "retries": 0},
    }


def bench_checkpoint(parent: str | None, state: dict[str, Any]) -> Checkpoint:
    """The checkpoint the store benchmarks commit: a new id, ``parent``, ``state``."""
    return Checkpoint(
        id=uuid.uuid4().hex,
        parent=parent,
        run_id="bench",
        status="running",
        state=state,
        created_at=datetime.now(UTC),
    )
