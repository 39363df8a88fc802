"""Hidden state tables: the tables that keep the value of a node of a stream table's query.

:func:`pgtrickle.dvm.materialize.decide` names the nodes whose value the delta rules cannot
re-derive cheaply (an aggregate of an aggregate, an aggregate joined on its values, the input
of a TopK). Each such node is kept in a table of its own, ``pgtrickle_changes.state_<pgt id>_
<position>_<fingerprint>``, with the node's columns and ``__pgt_row_id`` (its rows with their
multiplicity, as a stream table stores its own). The stream table's refresh reads it as stored
(the node's value at the last refresh) and applies the node's change to it in the same
transaction as its own (:mod:`pgtrickle.dvm.integrate`); a FULL refresh rebuilds it. It is not a
stream table: it has no catalog entry of its own, no schedule and no history — only a row in
``pgtrickle.pgt_state_tables`` (migration 019) — so users never see it except through
``explain``; it is dropped with its stream table (``pgtrickle._drop_state_tables``).

The fingerprint is a hash of the node's query (as PostgreSQL text over the sources): a changed
query, or a source changed underneath, gives new tables and drops the old ones. Column types
are PostgreSQL's own for that query — planned, never run — stored as
``pgtrickle._storage_type`` says (a domain as its base type, so writing runs no CHECK).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from pgtrickle.dvm import ir
from pgtrickle.dvm.compile import compile_ir

__all__ = [
    "SCHEMA",
    "StateTable",
    "drop_state_tables",
    "ensure_state_tables",
    "node_query",
    "plan_state_tables",
]

SCHEMA = "pgtrickle_changes"
ROW_ID = "__pgt_row_id"
_PROBE = "__pgt_state_probe"


@dataclass(frozen=True, eq=False)
class StateTable:
    """One kept node: its place in the query (``position``, in tree order, children first),
    why it is kept, and its table."""

    position: int
    node: ir.Node
    reason: str
    query: str
    """The node's value as one PostgreSQL query over the sources (columns, then ``__pgt_w``)."""
    name: str

    @property
    def columns(self) -> tuple[str, ...]:
        return self.node.columns

    @property
    def identifier(self) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(SCHEMA), sql.Identifier(self.name))

    @property
    def qualified(self) -> str:
        """The table's name as SQL text (``pgtrickle_changes."state_…"``)."""
        return f'{SCHEMA}."{self.name}"'


class _Sources:
    """Reads of a node's own query: every scan is its source table, as the query names it."""

    def __init__(self, relations: Mapping[str, tuple[str, str]]) -> None:
        self._relations = relations

    def post(self, scan: ir.Scan) -> tuple[str, str]:
        return self._relations[scan.relation]

    def delta(self, scan: ir.Scan) -> tuple[str, str]:  # pragma: no cover - a query has no Delta
        raise ValueError(f"a node's own query reads no change ({scan.relation})")

    def materialized(self, node: ir.Materialized) -> tuple[str, str]:  # pragma: no cover
        raise ValueError("a node's own query reads no hidden table")


def node_query(
    node: ir.Node,
    relations: Mapping[str, tuple[str, str]],
    column_types: Mapping[str, Mapping[str, str]] | None = None,
) -> str:
    """``node``'s value as one PostgreSQL query over the sources ``relations`` (a scan's
    relation → ``(schema, table)``): its columns, then its weight ``__pgt_w`` (pure)."""
    return compile_ir(node, _Sources(relations), dialect="postgres", column_types=column_types).sql()


def plan_state_tables(
    pgt_id: int,
    tree: ir.Node,
    kept: Mapping[ir.Node, str],
    relations: Mapping[str, tuple[str, str]],
    column_types: Mapping[str, Mapping[str, str]] | None = None,
) -> list[StateTable]:
    """The state tables of the stream table ``pgt_id`` whose query lowers to ``tree``, for the
    nodes ``kept`` (node → reason), children first (pure)."""
    out: list[StateTable] = []
    for node in ir.walk(tree):
        if node is tree or node not in kept:
            continue
        query = node_query(node, relations, column_types)
        fingerprint = hashlib.sha256(query.encode()).hexdigest()[:12]
        position = len(out)
        out.append(StateTable(position, node, kept[node], query, f"state_{pgt_id}_{position}_{fingerprint}"))
    return out


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
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(table.identifier, definition))
        conn.execute(
            sql.SQL("CREATE INDEX {} ON {} ({})").format(
                sql.Identifier(f"{table.name}_row_id"), table.identifier, sql.Identifier(ROW_ID)
            )
        )
        conn.execute(sql.SQL("REVOKE ALL ON {} FROM PUBLIC").format(table.identifier))
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
