"""Change buffers: what is pending for a stream table, and cleanup.

A buffer row belongs to the refresh window (S1, S2] of a stream table when
its writing transaction is visible in S2 and not in S1 (docs/ARCHITECTURE.md, invariant 3).
The buffer is read after S2 was taken (and, with WAL capture, after the
decoder has passed S2), so it holds every change of the window; the scan
starts at ``pg_snapshot_xmin(S1)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from pgtrickle.catalog.store import Source


@dataclass(frozen=True)
class PendingChanges:
    """Captured changes of one source not yet consumed by a stream table."""

    source: Source
    inserts: int
    deletes: int
    updates: int
    truncated: bool

    @property
    def rows(self) -> int:
        return self.inserts + self.deletes + self.updates


def rows_table(buffer_name: str) -> sql.Identifier:
    """The table of a change buffer that holds one row per change (what COPY and INSERT write).

    The buffer itself, ``pgtrickle_changes.<buffer_name>``, is a view over this
    table and, for table sources, the packed statement-trigger batches
    (``<buffer_name>_batches``); see ``pgtrickle._build_buffer_view``.
    """
    return sql.Identifier("pgtrickle_changes", f"{buffer_name}_rows")


def batches_table(buffer_name: str) -> sql.Identifier:
    """The table of a table source's buffer holding statement-trigger changes, up to 4096 to a row."""
    return sql.Identifier("pgtrickle_changes", f"{buffer_name}_batches")


_WINDOW = sql.SQL(
    "WHERE xid >= pg_snapshot_xmin(%(f)s::pg_snapshot) AND NOT pg_visible_in_snapshot(xid, %(f)s::pg_snapshot)"
    " AND pg_visible_in_snapshot(xid, %(u)s::pg_snapshot)"
)
"""The rows of a buffer in the window (``%(f)s``, ``%(u)s``]: written by a transaction visible in
``u`` and not in ``f``."""


def pending_changes(
    conn: psycopg.Connection, sources: tuple[Source, ...], frontier: str, upto: str
) -> list[PendingChanges]:
    """Counts of the changes in the window (``frontier``, ``upto``].

    ``upto`` is a snapshot taken before this read; with WAL capture the
    buffers may already hold later transactions, which it excludes.
    """
    result = []
    for source in sources:
        # Counted on the buffer's tables, not its view: a batch knows its size without
        # its packed changes being read.
        query = sql.SQL(
            "SELECT count(*) FILTER (WHERE action = 'I'), count(*) FILTER (WHERE action = 'D'),"
            " count(*) FILTER (WHERE action = 'U'), coalesce(bool_or(action = 'T'), false) FROM {} {}"
        ).format(rows_table(source.buffer_name), _WINDOW)
        if source.kind == "TABLE":
            query = sql.SQL(
                "SELECT sum(i), sum(d), sum(u), bool_or(t) FROM ({} UNION ALL"
                " SELECT coalesce(sum(n_changes) FILTER (WHERE action = 'I'), 0),"
                " coalesce(sum(n_changes) FILTER (WHERE action = 'D'), 0), 0, false FROM {} {}) AS x (i, d, u, t)"
            ).format(query, batches_table(source.buffer_name), _WINDOW)
        row = conn.execute(query, {"f": frontier, "u": upto}).fetchone()
        assert row is not None
        result.append(PendingChanges(source, int(row[0]), int(row[1]), int(row[2]), bool(row[3])))
    return result


def updates_change(
    conn: psycopg.Connection,
    source: Source,
    columns: Sequence[str],
    frontier: str,
    upto: str,
) -> bool:
    """Whether an UPDATE of ``source`` in the window (``frontier``, ``upto``] changed one of
    ``columns`` (buffer column names without their ``new_``/``old_`` prefix).

    Compared by stored image (``record_image_eq``, as ``REFRESH MATERIALIZED VIEW CONCURRENTLY``
    compares rows): ``1.0`` and ``1.00`` differ, two NULLs do not, and no operator of the column's
    type runs (a user's ``=`` never runs with the daemon's rights). An update whose columns all
    keep their image leaves every query reading only those columns as it was.
    """
    if not columns:
        return False
    row = conn.execute(
        sql.SQL("SELECT EXISTS (SELECT 1 FROM {} {} AND action = 'U' AND NOT {})").format(
            rows_table(source.buffer_name), _WINDOW, images_equal(columns)
        ),
        {"f": frontier, "u": upto},
    ).fetchone()
    assert row is not None
    return bool(row[0])


def images_equal(columns: Sequence[str]) -> sql.Composed:
    """SQL true for a buffer row whose ``new_`` and ``old_`` images of ``columns`` (buffer column
    names without the prefix; at least one) are stored alike: ``record_image_eq`` — ``1.0`` and
    ``1.00`` differ, two NULLs do not, and no operator of the columns' types runs."""
    if not columns:
        raise ValueError("images_equal needs at least one column")
    new = sql.SQL(", ").join(sql.Identifier("new_" + c) for c in columns)
    old = sql.SQL(", ").join(sql.Identifier("old_" + c) for c in columns)
    return sql.SQL("pg_catalog.record_image_eq(ROW({}), ROW({}))").format(new, old)


def written_by(conn: psycopg.Connection, source: Source, xid: int) -> PendingChanges:
    """Counts of the changes transaction ``xid`` wrote into a stream table's change buffer.

    Inside an atomic group's transaction (``conn`` is its connection, ``xid`` its id): what an
    upstream member's refresh recorded for its readers, not committed yet (refresh/group.py).
    """
    if source.kind != "STREAM_TABLE":
        raise ValueError(f"{source.schema}.{source.name} is not a stream table")
    row = conn.execute(
        sql.SQL(
            "SELECT count(*) FILTER (WHERE action = 'I'), count(*) FILTER (WHERE action = 'D'),"
            " count(*) FILTER (WHERE action = 'U'), coalesce(bool_or(action = 'T'), false)"
            " FROM {} WHERE xid = %s::text::xid8"
        ).format(rows_table(source.buffer_name)),
        (str(xid),),
    ).fetchone()
    assert row is not None
    return PendingChanges(source, int(row[0]), int(row[1]), int(row[2]), bool(row[3]))


_INTACT = sql.SQL(
    "to_regclass(pgtrickle._buffer_part(c.buffer_name, 'rows')) IS NOT NULL"
    " AND (c.source_kind <> 'TABLE'"
    "      OR to_regclass(pgtrickle._buffer_part(c.buffer_name, 'batches')) IS NOT NULL)"
)
"""The buffer's tables exist (one dropped by hand is skipped until `pgtrickle install` recreates it)."""


def cleanup_buffers(conn: psycopg.Connection) -> int:
    """Delete buffer rows every consumer's frontier has passed; returns rows deleted.

    A row is consumed by a stream table once its xid is below the xmin of the
    stream table's frontier (then it is visible in it). A source with a
    consumer that has no frontier yet (not initialized) keeps everything.
    Watermarks keep more: a hold_back stream table rebuilds a grouped source
    as of an older snapshot from the changes after it, so rows after the
    snapshot a hold_back refresh last read the source at, and after each
    group member's advancement at its group's last aligned point, stay too.
    The horizon used is recorded (``cleaned_below``), so a hold-back can tell
    whether the rows it needs are all there. A buffer whose tables were
    dropped by hand is skipped (the others are cleaned).
    """
    buffers = conn.execute(
        sql.SQL("""
        SELECT c.source_relid, c.buffer_name, c.source_kind = 'TABLE' AS batched,
               least(min(pg_snapshot_xmin(s.frontier)::text::numeric),
                     min(pg_snapshot_xmin((s.watermark_positions->'sources'->>c.source_relid::text)::pg_snapshot)
                         ::text::numeric),
                     (SELECT min(pg_snapshot_xmin(h.snapshot)::text::numeric)
                        FROM pgtrickle.pgt_watermark_group_sources m
                        JOIN pgtrickle.pgt_watermark_history h ON h.advancement_id = m.aligned_advancement
                       WHERE m.source_relid = c.source_relid))::text AS horizon,
               bool_or(s.frontier IS NULL) AS any_uninitialized
          FROM pgtrickle.pgt_change_sources c
          JOIN pgtrickle.pgt_dependencies d USING (source_relid)
          JOIN pgtrickle.pgt_stream_tables s USING (pgt_id)
         WHERE {intact}
         GROUP BY c.source_relid, c.buffer_name, c.source_kind
        """).format(intact=_INTACT)
    ).fetchall()
    deleted = 0
    for relid, buffer_name, batched, horizon, any_uninitialized in buffers:
        if any_uninitialized or horizon is None:
            continue
        removed = _delete_parts(conn, buffer_name, batched, sql.SQL("WHERE xid < %s::xid8"), (horizon,))
        deleted += removed
        if removed:
            conn.execute(
                "UPDATE pgtrickle.pgt_change_sources SET cleaned_below = greatest(cleaned_below, %s::xid8)"
                " WHERE source_relid = %s",
                (horizon, relid),
            )
    # Buffers of stream tables nobody reads hold only refresh markers: keep them empty.
    orphans = conn.execute(
        sql.SQL("""
        SELECT c.buffer_name FROM pgtrickle.pgt_change_sources c
         WHERE c.source_kind = 'STREAM_TABLE' AND {intact}
           AND NOT EXISTS (SELECT 1 FROM pgtrickle.pgt_dependencies d WHERE d.source_relid = c.source_relid)
        """).format(intact=_INTACT)
    ).fetchall()
    for (buffer_name,) in orphans:
        deleted += _delete_parts(conn, buffer_name, False, sql.SQL(""), ())
    return deleted


def _delete_parts(
    conn: psycopg.Connection,
    buffer_name: str,
    batched: bool,
    where: sql.Composable,
    params: tuple[object, ...],
) -> int:
    """Delete from a buffer's rows and (a table source's) batches; returns the changes deleted."""
    cur = conn.execute(sql.SQL("DELETE FROM {} {}").format(rows_table(buffer_name), where), params)
    deleted = cur.rowcount or 0
    if batched:
        row = conn.execute(
            sql.SQL(
                "WITH d AS (DELETE FROM {} {} RETURNING n_changes AS n) SELECT coalesce(sum(n), 0) FROM d"
            ).format(batches_table(buffer_name), where),
            params,
        ).fetchone()
        deleted += int(row[0]) if row else 0
    return deleted
