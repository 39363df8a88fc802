"""Check a stream table against its defining query (two-way EXCEPT ALL).

This is the test oracle and a user-facing check (``pgtrickle verify``): it
runs the defining query directly in PostgreSQL and compares multisets. Run it
when the sources are quiet, or in a transaction whose snapshot matches the
stream table's frontier; otherwise differences may just be pending changes.

A query that reads the clock (``now()``, ``current_date``, ...) is compared
as it was at the stream table's ``data_timestamp`` (the time of its last
refresh's snapshot): the clock expressions are pinned to that instant, as
the refresh pinned them (:mod:`pgtrickle.sql.clock`).
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from pgtrickle.sql.clock import clock_values, pin_clock


@dataclass(frozen=True)
class Verification:
    name: str
    missing: int
    """Rows the query returns that the stream table lacks."""
    extra: int
    """Rows the stream table has that the query does not return."""

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.extra == 0


def verify(conn: psycopg.Connection, name: str) -> Verification:
    row = conn.execute(
        "SELECT s.pgt_id, s.pgt_schema, s.pgt_name, s.pgt_relid, s.reads_clock, s.data_timestamp,"
        " pgtrickle._normalized_query(s.def_view) FROM pgtrickle.pgt_stream_tables s "
        "WHERE s.pgt_id = (pgtrickle._find_st(%s)).pgt_id", (name,)
    ).fetchone()
    assert row is not None
    pgt_id, schema, table, relid, clock, data_timestamp, definition = row
    cols = [r[0] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped"
        " AND attname NOT LIKE '\\_\\_pgt\\_%%' ORDER BY attnum", (relid,)).fetchall()]
    col_list = sql.SQL(", ").join(sql.Identifier(c) for c in cols)
    st = sql.SQL("SELECT {} FROM {}.{}").format(col_list, sql.Identifier(schema), sql.Identifier(table))
    query = sql.SQL("SELECT {} FROM pgtrickle.{}").format(col_list, sql.Identifier(f"pgt_def_{pgt_id}"))
    if clock and data_timestamp is not None:
        pinned = pin_clock(definition.strip().rstrip(";"), clock_values(conn, data_timestamp))
        query = sql.SQL("SELECT {} FROM ({}) q").format(col_list, sql.SQL(pinned))  # type: ignore[arg-type]
    missing = conn.execute(sql.SQL("SELECT count(*) FROM ({} EXCEPT ALL {}) d").format(query, st)).fetchone()
    extra = conn.execute(sql.SQL("SELECT count(*) FROM ({} EXCEPT ALL {}) d").format(st, query)).fetchone()
    assert missing is not None and extra is not None
    return Verification(f"{schema}.{table}", int(missing[0]), int(extra[0]))
