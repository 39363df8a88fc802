"""Pin the relations a transaction reads or writes to the OIDs the catalog tracks.

SQL names relations, PostgreSQL's catalog tracks them by OID, and a name can be
made to mean another relation between the moment the daemon looks it up and
the moment a statement is parsed: the owner of a source renames it and
creates a view (running their function) under the old name, or renames the
schema of a stream table and creates an impostor table with a trigger in a new
schema of the old name. The daemon would then read the view or write the
impostor with its own rights.

:func:`pin` closes that window for the rest of the calling transaction:

1. it share-locks the ``pg_namespace`` rows of the relations' schemas, so
   ``ALTER SCHEMA ... RENAME`` and ``DROP SCHEMA`` wait until the transaction
   ends (a superuser session only: row locks on a catalog need UPDATE rights
   on it; a daemon that is no superuser is no prize for this attack);
2. it takes the table lock (``ROW EXCLUSIVE`` for writes), so the relation
   itself cannot be renamed, moved or dropped; for reads, each Spark session
   takes ``ACCESS SHARE`` itself and checks the names again
   (:func:`session_guard`), so the lock is held only while a table is read;
3. it checks that each name now resolves to the expected OID and that the
   relation is of an expected kind (a table, never a view).

Any mismatch raises :class:`RelationIdentityChanged` before a single row is
read or written; the next refresh loads the current names again. Locking by
name before checking runs no code of the name's owner: ``LOCK TABLE`` on a
view only locks the tables under it.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from pgtrickle.errors import RefreshError

READ = "ACCESS SHARE"
WRITE = "ROW EXCLUSIVE"


class RelationIdentityChanged(RefreshError):
    """A relation's name no longer leads to the OID the catalog tracks (renamed, dropped, replaced)."""


@dataclass(frozen=True)
class Pin:
    """One relation to pin: its OID, the name the refresh will use for it, and the kinds it may be."""

    relid: int
    schema: str
    name: str
    kinds: tuple[str, ...] = ("r", "p")
    what: str = "source"

    @property
    def display(self) -> str:
        return f"{self.schema}.{self.name}"


def pin(conn: psycopg.Connection, pins: Sequence[Pin], mode: str) -> None:
    """Pin every relation of ``pins`` for the rest of ``conn``'s open transaction (see the module).

    ``READ`` (a refresh's coordinator) takes no table lock itself: the Spark sessions reading
    the tables lock and check them (:func:`session_guard`). A coordinator holding table locks
    for the whole job would deadlock with DDL on a source: the DDL's ACCESS EXCLUSIVE request
    waits for the coordinator, and Spark's sessions queue behind the DDL.
    """
    if mode not in (READ, WRITE):
        raise ValueError(f"not a pin lock mode: {mode!r}")
    if not pins:
        return
    relids = sorted({p.relid for p in pins})
    # Steps 1 and 3's look-up, in one round trip (pgtrickle._pin_relations, identity.sql).
    current = _rows(conn.execute("SELECT * FROM pgtrickle._pin_relations(%s::oid[])", (relids,)))
    for p in sorted(pins, key=lambda p: p.relid):
        _check(p, current.get(p.relid))
    if mode == READ:
        return
    for p in sorted(pins, key=lambda p: p.relid):
        conn.execute(
            sql.SQL("LOCK TABLE {} IN {} MODE").format(sql.Identifier(p.schema, p.name), sql.SQL(mode))
        )
    resolved: dict[str, int | None] = dict(
        conn.execute(
            "SELECT n, pg_catalog.to_regclass(n)::oid::bigint FROM unnest(%s::text[]) AS n",
            ([sql.Identifier(p.schema, p.name).as_string(conn) for p in pins],),
        ).fetchall()
    )
    current = _current(conn, relids)
    for p in pins:
        _check(p, current.get(p.relid))
        name = sql.Identifier(p.schema, p.name).as_string(conn)
        if resolved.get(name) != p.relid:
            raise RelationIdentityChanged(
                f"{p.what} {p.display} is no longer the relation pgtrickle tracks (OID {p.relid}): it was "
                "renamed or replaced meanwhile; nothing was read or written, the next refresh follows the change"
            )


def session_guard(pins: Sequence[Pin]) -> str | None:
    """SQL a reading session runs first: lock the pinned tables, then refuse if a name no longer
    leads to its OID (renamed meanwhile, or a view in its place). Runs no code of the tables' owners."""
    if not pins:
        return None
    ordered = sorted(pins, key=lambda p: p.relid)
    names = ", ".join(_quoted(p) for p in ordered)
    checks = " OR ".join(
        f"pg_catalog.to_regclass({_literal(_quoted(p))}) IS DISTINCT FROM {int(p.relid)}::oid"
        for p in ordered
    )
    body = (
        f"BEGIN IF {checks} THEN RAISE EXCEPTION 'pgtrickle: a source of this refresh was "
        "renamed or replaced while it ran; nothing was read, the next refresh follows the change' "
        "USING ERRCODE = 'object_not_in_prerequisite_state'; END IF; END"
    )
    tag = "$pgt_guard$"
    while tag in body:  # a name may not close the dollar quote
        tag = f"$pgt_{secrets.token_hex(4)}$"
    return f"LOCK TABLE {names} IN ACCESS SHARE MODE; DO {tag}{body}{tag}"


def _quoted(p: Pin) -> str:
    return '"' + p.schema.replace('"', '""') + '"."' + p.name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _current(conn: psycopg.Connection, relids: list[int]) -> dict[int, tuple[str, str, str]]:
    return _rows(
        conn.execute(
            "SELECT c.oid::bigint, n.nspname::text, c.relname::text, c.relkind::text"
            "  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.oid = ANY(%s::oid[])",
            (relids,),
        )
    )


def _rows(cursor: psycopg.Cursor) -> dict[int, tuple[str, str, str]]:
    """(oid, schema, name, kind) rows by OID."""
    return {int(r[0]): (r[1], r[2], r[3]) for r in cursor.fetchall()}


def _check(p: Pin, current: tuple[str, str, str] | None) -> None:
    if current is None:
        raise RelationIdentityChanged(f"{p.what} {p.display} (OID {p.relid}) no longer exists")
    schema, name, kind = current
    if kind not in p.kinds:
        raise RelationIdentityChanged(
            f"{p.what} {p.display} (OID {p.relid}) is now a relation of kind '{kind}', not a table; refused"
        )
    if (schema, name) != (p.schema, p.name):
        raise RelationIdentityChanged(
            f"{p.what} {p.display} (OID {p.relid}) was renamed to {schema}.{name} during this refresh; "
            "nothing was read or written, the next refresh uses the new name"
        )


def source_pins(sources: Sequence) -> list[Pin]:  # Sequence[Source]
    """The pins of a stream table's sources (a source stream table must be a plain table)."""
    return [
        Pin(s.relid, s.schema, s.name, ("r",) if s.kind == "STREAM_TABLE" else ("r", "p"), "source")
        for s in sources
    ]


def stream_table_pin(st) -> Pin:  # StreamTable
    return Pin(st.relid, st.schema, st.name, ("r",), "stream table")
