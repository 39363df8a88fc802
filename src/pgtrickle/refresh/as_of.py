"""Reading a source as it was at an older snapshot (for hold_back refreshes).

Spark can read a table only as it is at the refresh snapshot S2 (a past
snapshot cannot be imported once its exporting transaction has ended). The
change buffer holds the old and new values of every captured column of
every change, so the source as of a cap snapshot C is

    state(C) = (state(S2) ⊎ old values of the changes in (C, S2])
               ∖ new values of the changes in (C, S2]

as multisets (EXCEPT ALL after UNION ALL: a row inserted and deleted again
after C is in both the old and the new values, and must cancel). Only the
captured columns can be rebuilt — every column any stream table reads, which
is all a defining query uses; the others are NULL. A TRUNCATE after C cannot
be undone (it records no rows): the refresh fails rather than read wrong data
(the planner already refuses such a hold-back before any Spark job).
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from pgtrickle.catalog.store import Source
from pgtrickle.cdc.wal import wait_for_decoder
from pgtrickle.db.connection import JdbcTarget
from pgtrickle.errors import RefreshError
from pgtrickle.spark import carry, jdbc


def read_as_of(
    spark,
    conn: psycopg.Connection,
    target: JdbcTarget,
    dsn: str,
    source: Source,
    current,
    cap: str,
    upto: str,
):
    """``current`` (the source's DataFrame at ``upto``) rolled back to snapshot ``cap``."""
    row = conn.execute(
        "SELECT columns FROM pgtrickle.pgt_change_sources WHERE source_relid = %s", (source.relid,)
    ).fetchone()
    assert row is not None
    captured = sorted(row[0], key=lambda c: int(c["attnum"]))
    if source.cdc_mode == "wal":
        wait_for_decoder(conn, dsn)  # every change up to ``upto`` is in the buffer
    buffer = sql.Identifier("pgtrickle_changes", source.buffer_name)
    window = sql.SQL(
        "xid >= pg_snapshot_xmin({c}::pg_snapshot) AND NOT pg_visible_in_snapshot(xid, {c}::pg_snapshot)"
        " AND pg_visible_in_snapshot(xid, {u}::pg_snapshot)"
    ).format(c=sql.Literal(cap), u=sql.Literal(upto))
    truncated = conn.execute(
        sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE {} AND action = 'T')").format(buffer, window)
    ).fetchone()
    if truncated and truncated[0]:
        raise RefreshError(
            f"hold_back: {source.schema}.{source.name} was truncated after its watermark "
            "snapshot; it cannot be read as of it"
        )

    bases = dict(carry.source_columns(conn, source.relid, source.column_types) or ())
    label = f"{source.schema}.{source.name}"

    def images(prefix: str, actions: str) -> str:
        cols = sql.SQL(", ").join(
            sql.SQL("{} AS {}").format(
                carry.read_expression(
                    sql.Identifier(prefix + c["buf"]), bases[c["name"]], f"{label}.{c['name']}"
                )
                if c["name"] in bases
                else sql.Identifier(prefix + c["buf"]),
                sql.Identifier(c["name"]),
            )
            for c in captured
        )
        return (
            sql.SQL("SELECT {} FROM {} WHERE {} AND action IN ({})")
            .format(cols, buffer, window, sql.SQL(actions))
            .as_string(conn)
        )

    old = jdbc.read_query(spark, target, images("old_", "'D', 'U'"), None)
    new = jdbc.read_query(spark, target, images("new_", "'I', 'U'"), None)
    names = [c["name"] for c in captured]
    rebuilt = current.select(*names).unionAll(old).exceptAll(new)
    types = {f.name: f.dataType for f in current.schema.fields}
    # SQL expressions (not pyspark.sql.functions): the same for a local and a Spark Connect session.
    return rebuilt.selectExpr(
        *[
            quoted(c) if c in names else f"CAST(NULL AS {types[c].simpleString()}) AS {quoted(c)}"
            for c in current.columns
        ]
    )


def quoted(name: str) -> str:
    """A column name as a Spark column reference."""
    return "`" + name.replace("`", "``") + "`"
