"""WAL capture's side of the catalog: the slot, the publication, the tracked sources and their column types.

What the decoder (:mod:`pgtrickle.cdc.wal_decoder`) reads from PostgreSQL
besides the replication stream: which tables are captured into which buffer
under which column names, and whether their types can travel in binary
``pgoutput`` (see :mod:`pgtrickle.cdc.wal_rows`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from pgtrickle.cdc.pgoutput import Relation
from pgtrickle.cdc.wal_rows import ColumnTypes

PUBLICATION = "pgtrickle_pub"
SYNC_PREFIX = "pgtrickle.sync"


def slot_name_for(dbname: str) -> str:
    """The replication slot of a database: ``pgtrickle_<dbname>`` made slot-safe."""
    safe = re.sub(r"[^a-z0-9_]", "_", dbname.lower())
    return f"pgtrickle_{safe}"[:63]


def widen_xid(xid32: int, reference_xid8: int) -> int:
    """The xid8 of a recent 32-bit xid, given an xid8 taken around the same time (pure).

    Every live xid is within 2^31 of the next xid (PostgreSQL's wraparound
    protection), so the answer is the value with these low 32 bits closest to
    the reference. The reference may even be slightly *below* the xid: the
    walsender can send a commit before the committing backend has left the
    proc array, so a snapshot's xmax taken then does not cover it yet.
    """
    base = (reference_xid8 & ~0xFFFFFFFF) | (xid32 & 0xFFFFFFFF)
    candidates = [c for c in (base - (1 << 32), base, base + (1 << 32)) if c >= 0]
    return min(candidates, key=lambda c: abs(c - reference_xid8))


@dataclass
class TrackedSource:
    relid: int
    buffer_name: str
    columns: list[tuple[str, str]]  # (source column name, buffer column suffix)
    former_names: list[tuple[str, ...]] = field(default_factory=list)  # per column, names before renames


# For every column of the given relations: its type, and whether that type and every type inside it
# (domain base, array element, composite attribute, range subtype) has binary send and receive functions.
_COLUMN_TYPES_SQL = """
WITH RECURSIVE cols AS (
    SELECT a.attrelid, a.attname::text AS name, a.atttypid AS root
      FROM pg_attribute a
     WHERE a.attrelid = ANY (%s::regclass[]) AND a.attnum > 0 AND NOT a.attisdropped
), parts(root, part) AS (
    SELECT DISTINCT root, root FROM cols
  UNION
    SELECT p.root, x.sub
      FROM parts p JOIN pg_type t ON t.oid = p.part
     CROSS JOIN LATERAL (
            SELECT t.typbasetype WHERE t.typtype = 'd'
        UNION ALL SELECT t.typelem WHERE t.typelem <> 0 AND t.typsubscript = 'array_subscript_handler'::regproc
        UNION ALL SELECT a.atttypid FROM pg_attribute a
                   WHERE t.typtype = 'c' AND a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped
        UNION ALL SELECT r.rngsubtype FROM pg_range r WHERE r.rngtypid = t.oid
        UNION ALL SELECT r.rngtypid FROM pg_range r WHERE r.rngmultitypid = t.oid) x(sub)
)
SELECT c.attrelid::bigint, c.name, c.root::bigint,
       (SELECT bool_and(t.typsend::oid <> 0 AND t.typreceive::oid <> 0)
          FROM parts p JOIN pg_type t ON t.oid = p.part WHERE p.root = c.root)
  FROM cols c
"""


def tracked_sources(conn: psycopg.Connection) -> dict[int, TrackedSource]:
    """The tables captured by WAL (and by triggers: one buffer per source), by relation OID."""
    rows = conn.execute(
        "SELECT source_relid::bigint, buffer_name, columns FROM pgtrickle.pgt_change_sources"
        " WHERE source_kind = 'TABLE'"
    ).fetchall()
    return {
        int(relid): TrackedSource(
            int(relid),
            buffer,
            [(c["name"], c["buf"]) for c in cols],
            [tuple(c.get("former", ())) for c in cols],
        )
        for relid, buffer, cols in rows
    }


def binary_io_problem(conn: psycopg.Connection, relids: list[int]) -> str | None:
    """Why the walsender could not send every column of these relations in binary, if so."""
    if not relids:
        return None
    rows = conn.execute(_COLUMN_TYPES_SQL, ([str(r) for r in relids],)).fetchall()
    for relid, name, _, binary_io in rows:
        if not binary_io:
            return f"column {name!r} of relation {relid} has a type without binary send/receive functions"
    return None


def buffer_column_types(
    conn: psycopg.Connection,
    table: sql.Identifier,
    source: TrackedSource,
    relation: Relation,
    positions: list[int | None],
) -> list[ColumnTypes]:
    """For each captured column: the type the WAL carries, the type its buffer columns store, binary I/O.

    ``positions`` are the columns' positions in ``relation`` (the Relation
    message the changes were decoded under), ``None`` for a column it lacks.
    """
    types = {
        name: (typ, ok)
        for _, name, typ, ok in conn.execute(_COLUMN_TYPES_SQL, ([table.as_string(conn)],)).fetchall()
    }
    # A buffer stores a domain as its base type (catalog/sql/identity.sql), whose binary form
    # the domain's value has.
    wal_types = sorted({c.type_oid for c in relation.columns})
    base = {
        int(t): int(b)
        for t, b in conn.execute(
            "SELECT t::bigint, pgtrickle._base_type(t)::bigint FROM unnest(%s::oid[]) AS t", (wal_types,)
        ).fetchall()
    }
    columns = []
    for (name, buf), pos in zip(source.columns, positions, strict=True):
        new, old = types.get(f"new_{buf}"), types.get(f"old_{buf}")
        if new is not None and old is not None and new[0] == old[0]:
            stored, binary = new[0], bool(new[1] and old[1])
        else:
            stored, binary = None, False
        wal_type = relation.columns[pos].type_oid if pos is not None else None
        columns.append(
            ColumnTypes(name, base.get(wal_type, wal_type) if wal_type is not None else None, stored, binary)
        )
    return columns


def decoder_slot(conn: psycopg.Connection) -> str | None:
    """The slot of this database's WAL capture, if it is set up."""
    row = conn.execute("SELECT slot_name FROM pgtrickle.pgt_decoder_state LIMIT 1").fetchone()
    return str(row[0]) if row else None
