"""Typed array parameters (``codec.PgArray``, decision 0022's sixth round): what the server
reads is what was sent, for every element type, with and without nulls, on both the packed
path (at most ``_PACKED`` elements, no null) and the element-by-element one."""

from __future__ import annotations

import math

import psycopg
import pytest

from tests.postgres_support import Databases
from wakeful.store.postgres.codec import (
    _PACKED,
    BoolArray,
    Float8Array,
    Int4Array,
    Int8Array,
    PgArray,
    TextArray,
)

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]

_LONG = _PACKED + 5
_CASES: list[tuple[str, PgArray]] = [
    ("text", TextArray(["a", 'é"{},\\ \n', "", "\u2603" * 300])),
    ("text", TextArray(["a", None, ""])),
    ("text", TextArray([None])),
    ("text", TextArray([f"x{i}" for i in range(_LONG)])),
    ("int4", Int4Array([0, 1, -(2**31), 2**31 - 1])),
    ("int4", Int4Array([None, 3])),
    ("int8", Int8Array([2**63 - 1, -(2**63), 0])),
    ("int8", Int8Array([5, None])),
    ("int8", Int8Array(list(range(_LONG)))),
    ("int8", Int8Array([*range(_LONG), None])),
    ("float8", Float8Array([1.5, 2, -0.0, math.inf, 1e300])),
    ("float8", Float8Array([None, 0.25])),
    ("bool", BoolArray([True, False, True])),
    ("bool", BoolArray([False, None])),
]
_SQL_NAMES = {
    "text": "text[]",
    "int4": "integer[]",
    "int8": "bigint[]",
    "float8": "double precision[]",
    "bool": "boolean[]",
}


async def test_typed_arrays_reach_the_server_as_sent(pg_databases: Databases) -> None:
    dsn = await pg_databases.clone()
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        for kind, array in _CASES:
            cur = await conn.execute(
                f"SELECT %b::{kind}[], cardinality(%b::{kind}[]), pg_typeof(%b)::text",
                [array, array, array],
            )
            value, count, type_name = await cur.fetchone()  # type: ignore[misc]
            assert value == list(array.items) == list(array), kind
            assert count == len(array.items)
            assert type_name == _SQL_NAMES[kind]  # the parameter's own type, uncast
            if kind != "bool":
                # an empty array is an empty array of that type, not NULL
                empty = type(array)([])
                cur = await conn.execute(f"SELECT %b::{kind}[] = '{{}}'::{kind}[]", [empty])
                assert await cur.fetchone() == (True,)
        # a NaN goes through as a NaN
        cur = await conn.execute(
            "SELECT (%b::float8[])[1] = 'NaN'::float8", [Float8Array([math.nan])]
        )
        assert await cur.fetchone() == (True,)


@pytest.mark.parametrize(
    "array",
    [
        Int8Array([2**63]),
        Int8Array([2**64, None]),
        Int4Array([2**31]),
        Int4Array([1] * _LONG + [-(2**31) - 1]),
    ],
)
async def test_an_element_out_of_range_is_a_data_error(
    pg_databases: Databases, array: PgArray
) -> None:
    dsn = await pg_databases.clone()
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        with pytest.raises(psycopg.DataError, match="out of range"):
            await conn.execute("SELECT %b", [array])
