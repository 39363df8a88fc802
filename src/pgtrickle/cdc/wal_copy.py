"""The one ``COPY ... FROM STDIN`` into a change buffer the WAL decoder keeps open.

Rows of a source transaction are sent in chunks while it is being decoded, into
a COPY left open until the transaction's commit (or until rows of another
relation come), so the server stores rows while the next are decoded.
"""

from __future__ import annotations

import contextlib

import psycopg
from psycopg import sql

from pgtrickle.cdc.buffers import rows_table
from pgtrickle.cdc.wal_catalog import TrackedSource
from pgtrickle.cdc.wal_rows import COPY_HEADER, COPY_TRAILER


def buffer_table(source: TrackedSource) -> sql.Identifier:
    """The table the decoder writes a source's changes to (the one place that names it)."""
    return rows_table(source.buffer_name)


class BufferCopy:
    """The open COPY, if any: which relation's buffer it writes, in which format."""

    def __init__(self) -> None:
        self._copy: psycopg.Copy | None = None
        self._relid: int | None = None
        self._binary = False
        self._stack: contextlib.ExitStack | None = None

    def open(self, conn: psycopg.Connection, relid: int, source: TrackedSource, binary: bool) -> psycopg.Copy:
        """The COPY into ``source``'s buffer: the open one if it is that, else a new one (ending the other)."""
        if self._relid == relid:
            assert self._copy is not None
            return self._copy
        self.end()
        cols = ["xid", "action", "captured_at"]
        cols += [f"new_{buf}" for _, buf in source.columns]
        cols += [f"old_{buf}" for _, buf in source.columns]
        stmt = sql.SQL("COPY {} ({}) FROM STDIN{}").format(
            buffer_table(source),
            sql.SQL(", ").join(map(sql.Identifier, cols)),
            sql.SQL(" (FORMAT binary)" if binary else ""),
        )
        stack = contextlib.ExitStack()
        copy = stack.enter_context(conn.cursor().copy(stmt))
        if binary:
            copy.write(COPY_HEADER)
        self._copy, self._relid, self._binary, self._stack = copy, relid, binary, stack
        return copy

    def end(self, error: BaseException | None = None) -> None:
        """Finish the open COPY (the server has then stored every row), or abort it with ``error``."""
        stack = self._stack
        if stack is None:
            return
        copy = self._copy
        self.forget()
        if error is None:
            if self._binary:
                assert copy is not None, "a COPY stack holds its COPY"
                copy.write(COPY_TRAILER)
            stack.close()
        else:
            stack.__exit__(type(error), error, error.__traceback__)

    def forget(self) -> None:
        """Drop the open COPY without ending it (its connection is being closed)."""
        self._copy = self._relid = self._stack = None
