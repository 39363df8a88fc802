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

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from pgtrickle.refresh.clock_read import clock_values
from pgtrickle.sql.clock import pin_clock


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
        "WHERE s.pgt_id = (pgtrickle._find_st(%s)).pgt_id",
        (name,),
    ).fetchone()
    assert row is not None
    pgt_id, schema, table, relid, clock, data_timestamp, definition = row
    cols = [
        r[0]
        for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped"
            " AND attname NOT LIKE '\\_\\_pgt\\_%%' ORDER BY attnum",
            (relid,),
        ).fetchall()
    ]
    col_list = sql.SQL(", ").join(sql.Identifier(c) for c in cols)
    st = sql.SQL("SELECT {} FROM {}.{}").format(col_list, sql.Identifier(schema), sql.Identifier(table))
    query = sql.SQL("SELECT {} FROM pgtrickle.{}").format(col_list, sql.Identifier(f"pgt_def_{pgt_id}"))
    if clock and data_timestamp is not None:
        pinned = pin_clock(definition.strip().rstrip(";"), clock_values(conn, data_timestamp))
        query = sql.SQL("SELECT {} FROM ({}) q").format(col_list, sql.SQL(pinned))
    missing = conn.execute(sql.SQL("SELECT count(*) FROM ({} EXCEPT ALL {}) d").format(query, st)).fetchone()
    extra = conn.execute(sql.SQL("SELECT count(*) FROM ({} EXCEPT ALL {}) d").format(st, query)).fetchone()
    assert missing is not None and extra is not None
    return Verification(f"{schema}.{table}", int(missing[0]), int(extra[0]))


@dataclass(frozen=True)
class StreamTableCheck:
    """``pgtrickle verify`` of one stream table: its contents, and whether its change capture is intact."""

    name: str
    verification: Verification | None
    """``None`` when the comparison could not run (see ``error``)."""
    capture_problems: tuple[str, ...] = ()
    """Broken change capture it reads or writes: its contents may match now, but changes may be lost."""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return (
            self.error is None
            and not self.capture_problems
            and self.verification is not None
            and self.verification.ok
        )

    def describe(self) -> str:
        """Why it is not ok ('' when it is)."""
        parts = []
        if self.error is not None:
            parts.append(f"cannot verify: {self.error}")
        elif self.verification is not None and not self.verification.ok:
            parts.append(f"{self.verification.missing} rows missing, {self.verification.extra} rows extra")
        if self.capture_problems:
            parts.append(
                "change capture broken: "
                + "; ".join(self.capture_problems)
                + " (changes may be lost; run `pgtrickle install` to repair)"
            )
        return "; ".join(parts)


def check_all(conn: psycopg.Connection, names: Sequence[str] | None = None) -> list[StreamTableCheck]:
    """Check every stream table (or the named ones), each on its own: one that cannot be checked
    (its query fails, its name is unknown) is reported and the others are still checked.

    ``conn`` must be in autocommit mode (a failed check must not abort the others' transaction).
    """
    from pgtrickle.refresh.capture_check import broken_by_stream_table

    wanted: list[tuple[str, int | None, str | None]] = []  # (name, pgt_id, why it cannot be checked)
    if names is None:
        wanted = [
            (str(n), int(i), None)
            for n, i in conn.execute(
                "SELECT name, pgt_id FROM pgtrickle.stream_tables_info ORDER BY name"
            ).fetchall()
        ]
    for name in names or ():
        try:
            row = conn.execute(
                "SELECT pgtrickle._display_name(s.pgt_schema, s.pgt_name), s.pgt_id"
                " FROM pgtrickle._find_st(%s) s",
                (name,),
            ).fetchone()
            assert row is not None
            wanted.append((str(row[0]), int(row[1]), None))
        except psycopg.Error as exc:
            if conn.broken or conn.closed:
                raise
            wanted.append((name, None, _first_line(exc)))
    broken = broken_by_stream_table(conn)
    results = []
    for name, pgt_id, error in wanted:
        if pgt_id is None:
            results.append(StreamTableCheck(name, None, error=error))
            continue
        problems = tuple(f"{b.source}: {p}" for b in broken.get(pgt_id, ()) for p in b.problems)
        try:
            results.append(StreamTableCheck(name, verify(conn, name), problems))
        except psycopg.Error as exc:
            if conn.broken or conn.closed:
                raise
            results.append(StreamTableCheck(name, None, problems, error=_first_line(exc)))
    return results


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
