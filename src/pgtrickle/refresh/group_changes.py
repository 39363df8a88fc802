"""What the upstream members of an atomic group changed in the group's own transaction.

A member of a group (refresh/group.py) that reads another member refreshes DIFFERENTIAL from
that member's change in this refresh. The upstream member's apply recorded its change in its own
change buffer (the deleted rows ``D``, the inserted rows ``I``, as for any reader), inside the
group's transaction: the rows carry the group's transaction id and are not committed yet, so

* the group's own connection counts them (:meth:`GroupChanges.written`) and reads their keys
  for key-bounded reads (``refresh/delta_reads.py``), with ``xid = <the group's xid>`` as the
  window;
* Spark's JDBC sessions cannot see them: they are copied, byte for byte (binary COPY), into an
  unlogged table of their own that a short transaction commits (:meth:`GroupChanges.staged`),
  ``pgtrickle_changes.group_changes_<relid>``, with the change buffer's columns. Spark reads it
  with the very select list it reads a change buffer with, so the change arrives in exactly the
  representation of a committed one (spark/carry.py). The tables go when the group ends
  (:meth:`GroupChanges.drop`); one left by a crash is replaced by the next group's.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from pgtrickle.catalog.store import Source
from pgtrickle.cdc.buffers import PendingChanges, rows_table, written_by

STAGED_PREFIX = "group_changes_"

StagingConn = Callable[[], AbstractContextManager[psycopg.Connection]]
"""A connection whose work commits at once (``RefreshContext.staging_conn``)."""


def staged_table(relid: int) -> sql.Identifier:
    """The table holding a copy of what the group wrote into member ``relid``'s change buffer."""
    return sql.Identifier("pgtrickle_changes", f"{STAGED_PREFIX}{relid}")


@dataclass
class GroupChanges:
    """The changes the group's transaction (``xid``) recorded for the members' readers."""

    xid: int
    _written: dict[int, PendingChanges] = field(default_factory=dict)
    _staged: dict[int, sql.Identifier] = field(default_factory=dict)

    def predicate(self) -> sql.Composed:
        """The window of an upstream member's change in this refresh: the group's own rows."""
        return sql.SQL("xid = {}::xid8").format(sql.Literal(str(self.xid)))

    def written(self, conn: psycopg.Connection, source: Source) -> PendingChanges:
        """What the group wrote into ``source``'s change buffer (``conn``: the group's connection;
        asked once the upstream member has been applied)."""
        if source.relid not in self._written:
            self._written[source.relid] = written_by(conn, source, self.xid)
        return self._written[source.relid]

    def staged(self, conn: psycopg.Connection, staging: StagingConn, source: Source) -> sql.Identifier:
        """A committed copy of the group's rows of ``source``'s change buffer, readable by Spark."""
        if source.relid in self._staged:
            return self._staged[source.relid]
        table = staged_table(source.relid)
        rows = rows_table(source.buffer_name)
        with staging() as target:
            target.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
            target.execute(sql.SQL("CREATE UNLOGGED TABLE {} (LIKE {})").format(table, rows))
            self._staged[source.relid] = table
            out = sql.SQL("COPY (SELECT * FROM {} WHERE {}) TO STDOUT (FORMAT binary)").format(
                rows, self.predicate()
            )
            into = sql.SQL("COPY {} FROM STDIN (FORMAT binary)").format(table)
            with conn.cursor().copy(out) as reader, target.cursor().copy(into) as writer:
                for block in reader:
                    writer.write(block)
            if not target.autocommit:
                target.commit()
        return table

    def drop(self, staging: StagingConn) -> None:
        """Drop the copies made for this group."""
        if not self._staged:
            return
        with staging() as conn:
            for table in self._staged.values():
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
        self._staged.clear()
