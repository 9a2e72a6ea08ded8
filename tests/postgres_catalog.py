"""What PostgreSQL's catalog says a schema holds, as plain comparable rows: tables and their
columns, constraints, indexes, sequences, functions (with their bodies and settings),
triggers and views. Two schemas built differently (migrations step by step, ``schema.sql``)
are the same schema when ``catalog`` returns equal dictionaries for them."""

from __future__ import annotations

from typing import Any

import psycopg

QUERIES = {
    "columns": """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attgenerated, a.attidentity, a.attcollation,
               rank() OVER (PARTITION BY c.oid ORDER BY a.attnum)
          FROM pg_attribute a
          JOIN pg_class c ON c.oid = a.attrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE n.nspname = %(s)s AND a.attnum > 0 AND NOT a.attisdropped
           AND c.relkind IN ('r', 'p', 'v', 'm')
         ORDER BY 1, 9""",
    "relations": """
        SELECT c.relname, c.relkind, c.relpersistence, c.reloptions::text
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = %(s)s AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'i')
         ORDER BY 1""",
    "constraints": """
        SELECT t.relname, k.conname, k.contype, pg_get_constraintdef(k.oid)
          FROM pg_constraint k
          JOIN pg_class t ON t.oid = k.conrelid
          JOIN pg_namespace n ON n.oid = t.relnamespace
         WHERE n.nspname = %(s)s
         ORDER BY 1, 2""",
    "indexes": """
        SELECT t.relname, i.relname, pg_get_indexdef(i.oid)
          FROM pg_index x
          JOIN pg_class i ON i.oid = x.indexrelid
          JOIN pg_class t ON t.oid = x.indrelid
          JOIN pg_namespace n ON n.oid = t.relnamespace
         WHERE n.nspname = %(s)s
         ORDER BY 1, 2""",
    "sequences": """
        SELECT c.relname, format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement,
               s.seqmax, s.seqmin, s.seqcache, s.seqcycle
          FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = %(s)s
         ORDER BY 1""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid),
               pg_get_function_result(p.oid), p.prokind, p.provolatile, p.proparallel,
               p.prosecdef, p.proisstrict, l.lanname, p.proconfig::text, p.prosrc
          FROM pg_proc p
          JOIN pg_namespace n ON n.oid = p.pronamespace
          JOIN pg_language l ON l.oid = p.prolang
         WHERE n.nspname = %(s)s
         ORDER BY 1, 2""",
    "triggers": """
        SELECT c.relname, g.tgname, pg_get_triggerdef(g.oid), g.tgenabled
          FROM pg_trigger g
          JOIN pg_class c ON c.oid = g.tgrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = %(s)s AND NOT g.tgisinternal
         ORDER BY 1, 2""",
    "views": """
        SELECT c.relname, pg_get_viewdef(c.oid)
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = %(s)s AND c.relkind IN ('v', 'm')
         ORDER BY 1""",
    "types": """
        SELECT t.typname, t.typtype, format_type(t.oid, NULL)
          FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
         WHERE n.nspname = %(s)s AND t.typtype IN ('c', 'e', 'd')
           AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = t.typrelid
                           AND c.relkind <> 'c')
         ORDER BY 1""",
}


def catalog(dsn: str, schema: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every kind of object of ``schema`` in the database at ``dsn``, as sorted rows."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {
            kind: [tuple(row) for row in conn.execute(query, {"s": schema}).fetchall()]
            for kind, query in QUERIES.items()
        }


def differences(a: dict[str, list[tuple[Any, ...]]], b: dict[str, list[tuple[Any, ...]]]) -> str:
    """A readable account of what differs between two ``catalog`` results ('' if nothing)."""
    lines = []
    for kind in QUERIES:
        only_a = sorted(set(a[kind]) - set(b[kind]), key=repr)
        only_b = sorted(set(b[kind]) - set(a[kind]), key=repr)
        lines += [f"{kind}: only in the first: {str(row)[:300]}" for row in only_a]
        lines += [f"{kind}: only in the second: {str(row)[:300]}" for row in only_b]
        if not only_a and not only_b and a[kind] != b[kind]:
            lines.append(f"{kind}: same rows in another order")
    return "\n".join(lines)
