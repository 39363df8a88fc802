"""Key pushdown, the decisions: whether a key-bounded read pays, and which column bounds it.

:func:`pgtrickle.dvm.keyed.restrictions` finds the columns that bound each read of a delta plan
by a change's keys; the reader (``refresh/delta_reads.py``) reads only the rows holding those
keys (``col = ANY(keys)`` in PostgreSQL) when :func:`should_push_down` says it pays. When several
columns bound one read, :func:`narrowest` picks the one whose keys select the fewest rows by the
planner's statistics (:func:`rows_per_value`). Pure but for :func:`rows_per_value`'s catalog read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import psycopg

from pgtrickle.catalog.store import Source
from pgtrickle.dvm.keyed import Restriction
from pgtrickle.dvm.keyed_sources import Column, columns_of

__all__ = ["PUSHDOWN_MAX_KEYS", "PUSHDOWN_MIN_ROWS", "narrowest", "rows_per_value", "should_push_down"]

PUSHDOWN_MIN_ROWS = 10_000
"""Tables smaller than this are read whole: a key filter would not pay for itself."""
PUSHDOWN_MAX_KEYS = 100_000


def should_push_down(table_rows: float, key_count: int) -> bool:
    """Read only the rows matching the change's keys? (pure)"""
    return table_rows >= PUSHDOWN_MIN_ROWS and key_count <= PUSHDOWN_MAX_KEYS and key_count * 4 < table_rows


def narrowest(
    candidates: Sequence[Restriction],
    key_counts: Mapping[Column, int | None],
    per_value: Mapping[str, float],
    table_rows: float,
) -> Restriction:
    """The candidate (a column bounding the read, with its keys) expected to select the fewest
    rows: its key count (``None``: too many to list) times the rows holding one value of the
    column (``per_value``; a column without statistics counts as the whole table). Ties keep
    the earlier candidate (the analysis puts composite keys first, then the one with the fewest
    key sources). Pure.

    A composite key (a tuple of columns) holds one of its tuples in no more rows than one value
    of its most selective column does, and keeps no more rows than any of its columns' own
    candidate: its estimate is the smaller of the two.

    TPC-H Q20's lines of the changed (part, supplier) pairs: bound by their ~8,000 parts (30
    lines each) about 240,000 lines are read; by their ~7,000 suppliers (600 each), 4 million.
    """

    def estimate(candidate: Restriction) -> float | None:
        count = key_counts.get(candidate.column)
        if count is None:
            return None
        parts = columns_of(candidate.column)
        rows = min(table_rows, count * min(per_value.get(c, table_rows) for c in parts))
        if len(parts) > 1:
            own = [e for other in candidates if other.column in parts and (e := estimate(other)) is not None]
            rows = min([rows, *own])
        return rows

    best, fewest = candidates[0], table_rows + 1
    for candidate in candidates:
        rows = estimate(candidate)
        if rows is not None and rows < fewest:
            best, fewest = candidate, rows
    return best


def rows_per_value(
    conn: psycopg.Connection, source: Source, columns: Sequence[str], table_rows: float
) -> dict[str, float]:
    """The planner's estimate of the rows holding one value of each of ``columns`` of ``source``
    (``pg_stats.n_distinct``: a count, or minus a fraction of the rows); absent without
    statistics (or without the right to read them)."""
    rows = conn.execute(
        "SELECT attname::text, max(n_distinct) FROM pg_catalog.pg_stats"
        " WHERE schemaname = %s AND tablename = %s AND attname = ANY(%s) GROUP BY attname",
        (source.schema, source.name, list(columns)),
    ).fetchall()
    out: dict[str, float] = {}
    for name, distinct in rows:
        if distinct is None or distinct == 0:
            continue
        count = float(distinct) if distinct > 0 else -float(distinct) * table_rows
        out[name] = table_rows / max(count, 1.0)
    return out
