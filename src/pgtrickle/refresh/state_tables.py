"""Hidden state tables: the tables that keep the value of a node of a stream table's query.

:func:`pgtrickle.dvm.materialize.decide` names the nodes whose value the delta rules cannot
re-derive cheaply (an aggregate of an aggregate, an aggregate joined on its values, the input
of a TopK). Each such node is kept in a table of its own, ``pgtrickle_changes.state_<pgt id>_
<position>_<fingerprint>``, with the node's columns and ``__pgt_row_id`` (its rows with their
multiplicity, as a stream table stores its own). The stream table's refresh reads it as stored
(the node's value at the last refresh) and applies the node's change to it in the same
transaction as its own (:mod:`pgtrickle.dvm.integrate`); a FULL refresh rebuilds it. It is not a
stream table: it has no catalog entry of its own, no schedule and no history — only a row in
``pgtrickle.pgt_state_tables`` (migration 020) — so users never see it except through
``explain``; it is dropped with its stream table (``pgtrickle._drop_state_tables``).

The fingerprint is a hash of the node's query (as PostgreSQL text over the sources): a changed
query, or a source changed underneath, gives new tables and drops the old ones. Column types
are PostgreSQL's own for that query — planned, never run — stored as
``pgtrickle._storage_type`` says (a domain as its base type, so writing runs no CHECK).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql

from pgtrickle.db.columns import column_types
from pgtrickle.dvm.kept import SCHEMA, StateTable
from pgtrickle.refresh.delta_apply import same_value

__all__ = [
    "apply_state_change",
    "as_stored",
    "drop_state_tables",
    "ensure_state_tables",
    "fill_state_table",
    "stored_decimals",
]

ROW_ID = "__pgt_row_id"
WEIGHT = "__pgt_w"
_DELTA = "__pgt_state_delta"
_PROBE = "__pgt_state_probe"
_NUMERIC = re.compile(r"numeric\((\d+),(\d+)\)")


def _identifier(table: StateTable) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(SCHEMA), sql.Identifier(table.name))


def _storage_types(conn: psycopg.Connection, table: StateTable) -> list[str]:
    """PostgreSQL's storage types of the node's columns: its query planned as a temporary
    view (never run), each type as ``pgtrickle._storage_type`` stores it."""
    columns = sql.SQL(", ").join(sql.Identifier(c) for c in table.columns)
    with conn.transaction():
        conn.execute("SET LOCAL search_path = pg_catalog, pg_temp")
        conn.execute(sql.SQL("DROP VIEW IF EXISTS pg_temp.{}").format(sql.Identifier(_PROBE)))
        conn.execute(
            sql.SQL("CREATE TEMP VIEW {} AS SELECT {} FROM ({}) AS s").format(
                sql.Identifier(_PROBE),
                columns,
                sql.SQL(table.query),
            )
        )
        rows = conn.execute(
            "SELECT pgtrickle._storage_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = %s::regclass AND attnum > 0 ORDER BY attnum",
            (f"pg_temp.{_PROBE}",),
        ).fetchall()
        conn.execute(sql.SQL("DROP VIEW pg_temp.{}").format(sql.Identifier(_PROBE)))
    return [r[0] for r in rows]


def ensure_state_tables(
    conn: psycopg.Connection, pgt_id: int, tables: Sequence[StateTable]
) -> list[StateTable]:
    """Make ``pgt_id``'s state tables exactly ``tables``: drop the ones no longer wanted, create
    the missing ones (empty). Returns the created ones — they must be filled (a FULL refresh)
    before a differential refresh may read them. Runs in the caller's transaction."""
    existing = {
        (position, relname): relid
        for position, relname, relid in conn.execute(
            "SELECT s.position, c.relname::text, s.relid FROM pgtrickle.pgt_state_tables s"
            " JOIN pg_class c ON c.oid = s.relid WHERE s.pgt_id = %s",
            (pgt_id,),
        ).fetchall()
    }
    keep = [existing[(t.position, t.name)] for t in tables if (t.position, t.name) in existing]
    conn.execute("SELECT pgtrickle._drop_state_tables(%s, %s::oid[])", (pgt_id, keep))
    created = []
    for table in tables:
        if (table.position, table.name) in existing:
            continue
        types = _storage_types(conn, table)
        definition = sql.SQL(", ").join(
            [
                *(
                    sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t))
                    for c, t in zip(table.columns, types, strict=True)
                ),
                sql.SQL("{} bigint NOT NULL").format(sql.Identifier(ROW_ID)),
            ]
        )
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(_identifier(table), definition))
        conn.execute(
            sql.SQL("CREATE INDEX {} ON {} ({})").format(
                sql.Identifier(f"{table.name}_row_id"), _identifier(table), sql.Identifier(ROW_ID)
            )
        )
        conn.execute(sql.SQL("REVOKE ALL ON {} FROM PUBLIC").format(_identifier(table)))
        conn.execute(
            "INSERT INTO pgtrickle.pgt_state_tables (pgt_id, position, relid, fingerprint, reason)"
            " VALUES (%s, %s, %s::regclass, %s, %s)",
            (pgt_id, table.position, table.qualified, table.name.rsplit("_", 1)[1], table.reason),
        )
        created.append(table)
    return created


def drop_state_tables(conn: psycopg.Connection, pgt_id: int) -> int:
    """Drop every state table of ``pgt_id`` (the stream table no longer keeps any node)."""
    row = conn.execute("SELECT pgtrickle._drop_state_tables(%s)", (pgt_id,)).fetchone()
    return int(row[0]) if row else 0


def stored_decimals(conn: psycopg.Connection, table: StateTable) -> dict[str, tuple[int, int]]:
    """The ``numeric(precision, scale)`` columns of the table, as the FULL refresh that filled it
    set them from Spark's decimal types (:func:`fill_state_table`)."""
    out: dict[str, tuple[int, int]] = {}
    for column, type_name in column_types(conn, table.qualified).items():
        found = _NUMERIC.fullmatch(type_name)
        if found is not None:
            out[column] = (int(found.group(1)), int(found.group(2)))
    return out


def as_stored(df: Any, decimals: Mapping[str, tuple[int, int]]) -> Any:
    """A hidden table's change (a Spark DataFrame) with each decimal column cast to the type the
    FULL refresh computed it with (``decimals``: :func:`stored_decimals`). An additive state's
    sums are added to in Spark, which widens their decimal type; the rows read above it from the
    table and from its change must have one type, or the rows computed from them would hash to
    other row identities than a FULL refresh gives them. With ANSI mode on, a value that does not
    fit raises instead of becoming NULL."""
    from pyspark.sql.types import DecimalType

    wanted = []
    changed = False
    for field in df.schema.fields:
        name = field.name.replace("`", "``")
        target = decimals.get(field.name)
        if (
            target is not None
            and isinstance(field.dataType, DecimalType)
            and (
                field.dataType.precision,
                field.dataType.scale,
            )
            != target
        ):
            wanted.append(f"CAST(`{name}` AS DECIMAL({target[0]}, {target[1]})) AS `{name}`")
            changed = True
        else:
            wanted.append(f"`{name}`")
    return df.selectExpr(*wanted) if changed else df


class StateMismatch(Exception):
    """A hidden table's change does not match the table (it never should): refresh in full."""


def _load(conn: psycopg.Connection, table: StateTable, rows: Sequence[tuple], weighted: bool) -> None:
    """Rows ``(columns..., [weight,] row id)`` into the temporary table ``__pgt_state_delta``."""
    cols = [*table.columns, *([WEIGHT] if weighted else []), ROW_ID]
    conn.execute(sql.SQL("DROP TABLE IF EXISTS pg_temp.{}").format(sql.Identifier(_DELTA)))
    conn.execute(
        sql.SQL("CREATE TEMP TABLE {} AS SELECT {} FROM {} WITH NO DATA").format(
            sql.Identifier(_DELTA),
            sql.SQL(", ").join(
                [sql.Identifier(c) for c in table.columns]
                + ([sql.SQL("0::bigint AS {}").format(sql.Identifier(WEIGHT))] if weighted else [])
                + [sql.Identifier(ROW_ID)]
            ),
            _identifier(table),
        )
    )
    with conn.cursor().copy(
        sql.SQL("COPY {} ({}) FROM STDIN").format(
            sql.Identifier(_DELTA), sql.SQL(", ").join(sql.Identifier(c) for c in cols)
        )
    ) as copy:
        for row in rows:
            copy.write_row(row)


def fill_state_table(
    conn: psycopg.Connection,
    table: StateTable,
    rows: Sequence[tuple],
    decimals: Mapping[str, tuple[int, int]] | None = None,
) -> int:
    """Replace the table's rows by ``rows`` (``columns..., row id``; a FULL refresh). In the
    caller's transaction.

    ``decimals``: per column computed as a Spark decimal, its (precision, scale). The column
    becomes ``numeric(precision, scale)``: a differential refresh reads the table back by JDBC,
    and an unconstrained ``numeric`` would come back as ``decimal(38,18)``, whose values hash
    differently from the ones a FULL refresh computed (the stream table's row identity), so a
    delta would not match the rows it changes."""
    conn.execute(sql.SQL("TRUNCATE {}").format(_identifier(table)))
    for column, (precision, scale) in (decimals or {}).items():
        conn.execute(
            sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE numeric({}, {})").format(
                _identifier(table), sql.Identifier(column), sql.Literal(precision), sql.Literal(scale)
            )
        )
    cols = sql.SQL(", ").join([*(sql.Identifier(c) for c in table.columns), sql.Identifier(ROW_ID)])
    with conn.cursor().copy(sql.SQL("COPY {} ({}) FROM STDIN").format(_identifier(table), cols)) as copy:
        for row in rows:
            copy.write_row(row)
    return len(rows)


def apply_state_change(
    conn: psycopg.Connection, table: StateTable, rows: Sequence[tuple], equality: dict[str, str]
) -> tuple[int, int]:
    """Apply a consolidated change (``columns..., weight, row id``) to the table: a negative
    weight deletes that many copies of the row, a positive one inserts them. Counted: a change
    deleting rows the table does not hold raises :class:`StateMismatch`. In the caller's
    transaction; ``equality``: the ``=`` to match a column's values with (``OPERATOR(s.=)``)."""
    if not rows:
        return 0, 0
    _load(conn, table, rows, weighted=True)
    target = _identifier(table)
    same = " AND ".join(
        [f"t.{ROW_ID} = d.{ROW_ID}"]
        + [same_value(f"t.{_quoted(c)}", f"d.{_quoted(c)}", equality.get(c)) for c in table.columns]
    )
    expected = sum(-r[len(table.columns)] for r in rows if r[len(table.columns)] < 0)
    deleted = conn.execute(
        sql.SQL(
            "DELETE FROM {t} AS t WHERE t.ctid = ANY(ARRAY("
            "SELECT x.tid FROM (SELECT t.ctid AS tid, -d.{w} AS n, row_number() OVER"
            " (PARTITION BY d.ctid ORDER BY t.ctid) AS rn FROM {t} AS t JOIN {d} AS d ON {same}"
            " WHERE d.{w} < 0) x WHERE x.rn <= x.n))"
        ).format(t=target, d=sql.Identifier(_DELTA), w=sql.Identifier(WEIGHT), same=sql.SQL(same))
    ).rowcount
    if deleted != expected:
        raise StateMismatch(
            f"the change of hidden table {table.name} deletes {expected} rows but {deleted} matched"
        )
    cols = sql.SQL(", ").join([*(sql.Identifier(c) for c in table.columns), sql.Identifier(ROW_ID)])
    d_cols = sql.SQL(", ").join(
        [
            *(sql.SQL("d.{}").format(sql.Identifier(c)) for c in table.columns),
            sql.SQL("d.{}").format(sql.Identifier(ROW_ID)),
        ]
    )
    inserted = conn.execute(
        sql.SQL(
            "INSERT INTO {t} ({cols}) SELECT {d_cols} FROM {d} AS d"
            " CROSS JOIN LATERAL generate_series(1, d.{w}) WHERE d.{w} > 0"
        ).format(t=target, cols=cols, d_cols=d_cols, d=sql.Identifier(_DELTA), w=sql.Identifier(WEIGHT))
    ).rowcount
    conn.execute(sql.SQL("DROP TABLE pg_temp.{}").format(sql.Identifier(_DELTA)))
    return inserted, deleted


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
