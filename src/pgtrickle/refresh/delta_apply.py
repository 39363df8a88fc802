"""Applying a consolidated delta (rows with weights) to a stream table in PostgreSQL.

The delta arrives as the stored columns a refresh writes (:attr:`Layout.columns`), the weight
``__pgt_w`` and the row identity ``__pgt_row_id`` — collected rows (COPYed into a temporary
table) or a staging table Spark wrote by JDBC. In the apply transaction:

1. consolidate: one row per distinct (row, identity), weights summed, zero weights dropped;
2. delete: for a weight −n, n copies matching the row identity and every stored column
   (``IS NOT DISTINCT FROM``, or the type's own ``=``); the number deleted must be the number
   the delta deletes, else the delta does not match the table and the refresh runs FULL;
3. insert: for a weight +n, n copies; a stored aggregate's AVG columns are computed here from
   their exact state columns (:func:`pgtrickle.dvm.layout.average_expression`).

Deletes and inserts are explicit statements, so user triggers see correct OLD / NEW rows, and
when other stream tables read this one, the deleted and inserted rows (visible columns) go to
its own change buffer in the same statement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgtrickle.catalog.store import StreamTable
from pgtrickle.cdc.buffers import rows_table
from pgtrickle.db.columns import column_types
from pgtrickle.db.query import one_row, scalar
from pgtrickle.dvm.ir import WEIGHT
from pgtrickle.dvm.layout import ROW_ID, Layout, average_expression
from pgtrickle.errors import PgTrickleError
from pgtrickle.refresh.context import RefreshContext
from pgtrickle.spark import jdbc
from pgtrickle.sql.ident import quote_ident

DELTA_TABLE = "pg_temp.__pgt_delta"
RAW_TABLE = "pg_temp.__pgt_raw"


class DeltaMismatch(PgTrickleError):
    """The delta deletes rows the stream table does not hold (it runs FULL instead)."""


@dataclass
class Staged:
    """A delta written by Spark into an unlogged staging table."""

    table: str
    columns: list[str]


def stage_delta(ctx: RefreshContext, st: StreamTable, targets: Sequence[str], df: Any) -> Staged:
    """Write a large delta (the Spark DataFrame ``df``, its columns stored as ``targets``: the
    layout's columns, the weight, the row identity) by partitioned JDBC into an unlogged staging
    table, created here with the stream table's column types."""
    stored = column_types(ctx.conn, st.relid)
    name = f"delta_{st.pgt_id}"
    table = sql.SQL("pgtrickle_changes.{}").format(sql.Identifier(name))
    cols = [
        sql.SQL("{} {}").format(sql.Identifier(df_col), sql.SQL(stored.get(t, "bigint")))
        for df_col, t in zip(df.columns, targets, strict=True)
    ]
    with ctx.staging_conn() as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
        conn.execute(sql.SQL("CREATE UNLOGGED TABLE {} ({})").format(table, sql.SQL(", ").join(cols)))
    jdbc.write_append(df, ctx.target, f'pgtrickle_changes."{name}"')
    return Staged(f"pgtrickle_changes.{quote_ident(name)}", list(df.columns))


@dataclass
class OwnBuffer:
    """The stream table's own change buffer, when some stream table reads it."""

    table: str
    columns: dict[str, str]


def own_buffer(conn: psycopg.Connection, st: StreamTable) -> OwnBuffer | None:
    row = conn.execute(
        """
        SELECT c.buffer_name, c.columns FROM pgtrickle.pgt_change_sources c
         WHERE c.source_relid = %s
           AND EXISTS (SELECT 1 FROM pgtrickle.pgt_dependencies d WHERE d.source_relid = c.source_relid)
        """,
        (st.relid,),
    ).fetchone()
    if row is None:
        return None
    columns = {c["name"]: c["buf"] for c in (row[1] or [])}
    return OwnBuffer(rows_table(row[0]).as_string(conn), columns)


def same_value(left: str, right: str, operator: str | None = None) -> str:
    """SQL that is true when two values are equal or both NULL (else false, never NULL).

    ``operator`` is ``None`` for ``IS NOT DISTINCT FROM``, or the schema-qualified
    ``OPERATOR(s.=)`` of a type whose ``=`` lives in another schema.
    """
    if operator is None:
        return f"{left} IS NOT DISTINCT FROM {right}"
    return f"coalesce({left} {operator} {right} OR ({left} IS NULL AND {right} IS NULL), false)"


def drop_temp(conn: psycopg.Connection, name: str) -> None:
    kind = conn.execute("SELECT relkind::text FROM pg_class WHERE oid = to_regclass(%s)", (name,)).fetchone()
    if kind is not None:
        conn.execute(f"DROP {'VIEW' if kind[0] == 'v' else 'TABLE'} {name}")


class DeltaApply:
    """The apply of one delta to ``st`` (inside the caller's transaction)."""

    def __init__(
        self,
        conn: psycopg.Connection,
        st: StreamTable,
        layout: Layout,
        equality: Mapping[str, str],
        buffer: OwnBuffer | None,
    ) -> None:
        self.conn = conn
        self.st = st
        self.layout = layout
        self.equality = equality
        self.buffer = buffer

    def apply(self, rows: Sequence[tuple] | Staged) -> tuple[int, int]:
        """Returns (inserted, deleted)."""
        written = list(self.layout.columns)
        self._load(rows, written)
        cols = ", ".join(quote_ident(c) for c in [*written, ROW_ID])
        self.conn.execute(
            f"CREATE TEMP TABLE {DELTA_TABLE.split('.')[-1]} ON COMMIT DROP AS "
            f"SELECT {cols}, sum({WEIGHT})::bigint AS {WEIGHT}, (row_number() OVER ())::int AS __pgt_seq"
            f" FROM {RAW_TABLE} GROUP BY {cols} HAVING sum({WEIGHT}) <> 0"
        )
        self.conn.execute(f"ANALYZE {DELTA_TABLE}")
        expected = int(
            scalar(self.conn, f"SELECT coalesce(sum(-{WEIGHT}), 0) FROM {DELTA_TABLE} WHERE {WEIGHT} < 0")
        )
        deleted = self._captured(self._delete(written), "D")
        if deleted != expected:
            raise DeltaMismatch(f"the delta deletes {expected} rows but {deleted} matched the stream table")
        inserted = self._captured(self._insert(written), "I")
        return inserted, deleted

    def cleanup(self) -> None:
        for name in (DELTA_TABLE, RAW_TABLE):
            drop_temp(self.conn, name)

    def _load(self, rows: Sequence[tuple] | Staged, written: list[str]) -> None:
        drop_temp(self.conn, RAW_TABLE)
        short = RAW_TABLE.split(".")[-1]
        if isinstance(rows, Staged):
            select = [
                f"{quote_ident(src)} AS {quote_ident(dst)}"
                for src, dst in zip(rows.columns, [*written, WEIGHT, ROW_ID], strict=True)
            ]
            self.conn.execute(f"CREATE TEMP VIEW {short} AS SELECT {', '.join(select)} FROM {rows.table}")
            return
        like = ", ".join(quote_ident(c) for c in [*written, ROW_ID])
        self.conn.execute(
            f"CREATE TEMP TABLE {short} ON COMMIT DROP AS SELECT {like} FROM {self.st.qualified} WITH NO DATA"
        )
        self.conn.execute(f"ALTER TABLE {RAW_TABLE} ADD COLUMN {WEIGHT} bigint")
        col_list = ", ".join(quote_ident(c) for c in [*written, WEIGHT, ROW_ID])
        with self.conn.cursor().copy(f"COPY {RAW_TABLE} ({col_list}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        self.conn.execute(f"ANALYZE {RAW_TABLE}")

    def _returning(self) -> str:
        return ", ".join(f"t.{quote_ident(c.name)}" for c in self.st.columns) or "1"

    def _delete(self, written: list[str]) -> str:
        target, d = self.st.qualified, DELTA_TABLE
        same = " AND ".join(
            [f"t.{ROW_ID} = d.{ROW_ID}"]
            + [
                same_value(f"t.{quote_ident(c)}", f"d.{quote_ident(c)}", self.equality.get(c))
                for c in written
            ]
        )
        return (
            f"DELETE FROM {target} AS t WHERE t.ctid = ANY(ARRAY("
            f"SELECT x.tid FROM (SELECT t.ctid AS tid, -d.{WEIGHT} AS n,"
            f" row_number() OVER (PARTITION BY d.__pgt_seq ORDER BY t.ctid) AS rn"
            f" FROM {target} AS t JOIN {d} AS d ON {same} WHERE d.{WEIGHT} < 0) x WHERE x.rn <= x.n))"
            f" RETURNING {self._returning()}"
        )

    def _insert(self, written: list[str]) -> str:
        stored = self.layout.stored
        names = [*written]
        values = [f"d.{quote_ident(c)}" for c in written]
        types = {c.name: c.type for c in self.st.columns}
        for average in stored.averages if stored is not None else ():
            names.append(average.column)
            values.append(
                average_expression(
                    average.sum_column, average.count_column, types.get(average.column, "numeric"), "d."
                )
            )
        if stored is not None:
            for derived in stored.derived:
                names.append(derived.column)
                values.append(stored.derived_sql(derived, lambda c: f"d.{quote_ident(c)}"))
        cols = ", ".join([*(quote_ident(c) for c in names), ROW_ID])
        return (
            f"INSERT INTO {self.st.qualified} AS t ({cols}) SELECT {', '.join(values)}, d.{ROW_ID}"
            f" FROM {DELTA_TABLE} AS d CROSS JOIN LATERAL generate_series(1, d.{WEIGHT})"
            f" WHERE d.{WEIGHT} > 0 RETURNING {self._returning()}"
        )

    def _captured(self, statement: str, action: str) -> int:
        """Run a DML ... RETURNING <visible columns>; record its rows in the own buffer; return the count."""
        buffer = self.buffer
        if buffer is None:
            return int(one_row(self.conn.execute(f"WITH x AS ({statement}) SELECT count(*) FROM x"))[0])
        prefix = "new_" if action == "I" else "old_"
        cols = [c.name for c in self.st.columns if c.name in buffer.columns]
        targets = "".join(f", {quote_ident(prefix + buffer.columns[c])}" for c in cols)
        values = "".join(f", x.{quote_ident(c)}" for c in cols)
        cur = self.conn.execute(
            f"WITH x AS ({statement}), w AS (INSERT INTO {buffer.table} (xid, action{targets})"
            f" SELECT pg_current_xact_id(), '{action}'{values} FROM x RETURNING 1)"
            " SELECT count(*) FROM w"
        )
        return int(one_row(cur)[0])
