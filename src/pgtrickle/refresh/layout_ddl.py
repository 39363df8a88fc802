"""Making a stream table match its :class:`~pgtrickle.dvm.layout.Layout`: hidden columns, indexes.

:func:`ensure_layout` adds or drops hidden ``__pgt_*`` state columns, creates
the index on ``__pgt_row_id`` and says whether the contents must be recomputed.
"""

from __future__ import annotations

from collections.abc import Mapping

import psycopg
from psycopg import sql

from pgtrickle.catalog import identity
from pgtrickle.catalog.store import StreamTable
from pgtrickle.db.columns import column_types
from pgtrickle.dvm import ir
from pgtrickle.dvm.compile import compile_ir
from pgtrickle.dvm.layout import Layout
from pgtrickle.dvm.stored import StoredAggregate, stored_rows
from pgtrickle.sql.ident import quote_ident


def _index_name(st: StreamTable, kind: str) -> str:
    return f"pgt_{kind}_{st.relid}"


def row_index_name(st: StreamTable) -> str:
    """The index on ``__pgt_row_id`` a differentially maintained table has."""
    return _index_name(st, "rowid")


def ensure_layout(conn: psycopg.Connection, st: StreamTable, layout: Layout) -> bool:
    """Make the table match ``layout``; True when its contents must be recomputed (FULL)."""
    existing = {
        name: typ
        for name, typ in column_types(conn, st.relid).items()
        if name.startswith("__pgt_") and name != "__pgt_row_id"
    }
    wanted: dict[str, str] = {}
    if layout.hidden and layout.stored is not None:
        wanted = _probe_types(conn, st, layout.stored)
    table = sql.SQL("{}.{}").format(sql.Identifier(st.schema), sql.Identifier(st.name))
    changed = False
    with conn.transaction():
        identity.pin(conn, [identity.stream_table_pin(st)], identity.WRITE)
        for name, typ in existing.items():
            if wanted.get(name) != typ:
                conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(table, sql.Identifier(name)))
                changed = True
        for name in layout.hidden:
            if existing.get(name) != wanted[name]:
                conn.execute(
                    sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(
                        table, sql.Identifier(name), sql.SQL(wanted[name])
                    )
                )
                changed = True
        row_index = sql.Identifier(st.schema, _index_name(st, "rowid"))
        key_index = sql.Identifier(st.schema, _index_name(st, "keys"))
        if layout.differential:
            conn.execute(
                sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (__pgt_row_id)").format(
                    sql.Identifier(_index_name(st, "rowid")), table
                )
            )
        else:
            conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(row_index))
        if changed:
            conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(key_index))
            if st.frontier is not None:
                # The new hidden columns are empty: only a FULL refresh fills them. Say so in the
                # catalog, with the change: a refresh that fails, is skipped by a gate or dies
                # before it completes must not leave the next one to go DIFFERENTIAL over them.
                conn.execute(
                    "UPDATE pgtrickle.pgt_stream_tables SET needs_reinit = true WHERE pgt_id = %s",
                    (st.pgt_id,),
                )
    return changed


class _Relations:
    """Reads of a plan over the stream table's sources, by name (views, or the tables themselves)."""

    def __init__(self, names: Mapping[str, str | tuple[str, str]]) -> None:
        self._names = names

    def post(self, scan: ir.Scan) -> str | tuple[str, str]:
        return self._names[scan.relation]

    def delta(self, scan: ir.Scan) -> str:
        raise ValueError("a stored state query reads no change")

    def materialized(self, node: ir.Materialized) -> str:
        raise ValueError("a stored state query reads no hidden table")


def _types(st: StreamTable) -> dict[str, dict[str, str]]:
    return {f"{s.schema}.{s.name}": dict(s.column_types) for s in st.sources}


def stored_state_sql(st: StreamTable, stored: StoredAggregate, views: Mapping[tuple[str, str], str]) -> str:
    """Spark SQL computing the stored state (:attr:`StoredAggregate.written` then ``__pgt_w``)
    over the sources' views (``(schema, table)`` → view), for a FULL refresh."""
    names: dict[str, str | tuple[str, str]] = {f"{s}.{t}": v for (s, t), v in views.items()}
    plan = stored_rows(stored, stored.state)
    return compile_ir(plan, _Relations(names), dialect="spark", column_types=_types(st)).sql()


def kept_state_sql(st: StreamTable, node: ir.Node, views: Mapping[tuple[str, str], str]) -> str:
    """Spark SQL computing a kept node's value (its columns then ``__pgt_w``) over the sources'
    views (``(schema, table)`` → view), to fill its hidden state table at a FULL refresh."""
    names: dict[str, str | tuple[str, str]] = {f"{s}.{t}": v for (s, t), v in views.items()}
    return compile_ir(node, _Relations(names), dialect="spark", column_types=_types(st)).sql()


def _probe_types(conn: psycopg.Connection, st: StreamTable, stored: StoredAggregate) -> dict[str, str]:
    """PostgreSQL's types of the hidden columns, from a temporary view of the state query."""
    names: dict[str, str | tuple[str, str]] = {f"{s.schema}.{s.name}": (s.schema, s.name) for s in st.sources}
    plan = stored_rows(stored, stored.state)
    query = compile_ir(plan, _Relations(names), dialect="postgres", column_types=_types(st)).sql()
    columns = ", ".join(quote_ident(c) for c in stored.hidden)
    with conn.transaction():
        conn.execute("DROP VIEW IF EXISTS pg_temp.__pgt_probe")
        conn.execute(
            sql.SQL("CREATE TEMP VIEW __pgt_probe AS SELECT {} FROM ({}) AS s").format(
                sql.SQL(columns), sql.SQL(query)
            )
        )
        types = column_types(conn, "pg_temp.__pgt_probe")
        conn.execute("DROP VIEW pg_temp.__pgt_probe")
    return {name: types[name] for name in stored.hidden}


def equality_operators(conn: psycopg.Connection, relid: int) -> dict[str, str]:
    """Column name -> ``OPERATOR(s.=)`` for the columns of ``relid`` that need one (``delta_apply.same_value``)."""
    rows = conn.execute(
        "SELECT attname::text, pgtrickle._equality_operator(atttypid, format('column %%I has', attname))"
        " FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped",
        (relid,),
    ).fetchall()
    return {name: op for name, op in rows if op is not None}
