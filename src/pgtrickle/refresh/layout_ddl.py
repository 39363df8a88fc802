"""Making a stream table match its :class:`~pgtrickle.dvm.layout.Layout`: hidden columns, indexes.

:func:`ensure_layout` adds or drops hidden ``__pgt_*`` state columns, creates
the index on ``__pgt_row_id`` and says whether the contents must be recomputed.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from pgtrickle.catalog import identity
from pgtrickle.catalog.store import StreamTable
from pgtrickle.db.columns import column_types
from pgtrickle.dvm import aggregate as agg_rules
from pgtrickle.dvm.analysis import AggregateShape
from pgtrickle.dvm.layout import Layout


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
    if layout.hidden:
        wanted = _probe_types(conn, layout)
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


def state_types(conn: psycopg.Connection, shape: AggregateShape) -> dict[str, str]:
    """PostgreSQL's types of an aggregate's hidden state columns."""
    probe = Layout(agg_rules.state_query(shape).sql("postgres"), (), shape.hidden_columns(), (), True)
    return _probe_types(conn, probe)


def _probe_types(conn: psycopg.Connection, layout: Layout) -> dict[str, str]:
    """PostgreSQL's types of the hidden columns, from a temporary view of the state query."""
    with conn.transaction():
        conn.execute("SET LOCAL search_path = pg_catalog, pg_temp")
        conn.execute("DROP VIEW IF EXISTS pg_temp.__pgt_probe")
        conn.execute(sql.SQL("CREATE TEMP VIEW __pgt_probe AS {}").format(sql.SQL(layout.query_sql)))
        types = column_types(conn, "pg_temp.__pgt_probe")
        conn.execute("DROP VIEW pg_temp.__pgt_probe")
    return {name: types[name] for name in layout.hidden}


def equality_operators(conn: psycopg.Connection, relid: int) -> dict[str, str]:
    """Column name -> ``OPERATOR(s.=)`` for the columns of ``relid`` that need one (``dvm.aggregate.same_value``)."""
    rows = conn.execute(
        "SELECT attname::text, pgtrickle._equality_operator(atttypid, format('column %%I has', attname))"
        " FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped",
        (relid,),
    ).fetchall()
    return {name: op for name, op in rows if op is not None}
