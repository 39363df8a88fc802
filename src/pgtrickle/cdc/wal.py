"""WAL change capture: decode ``pgoutput`` from a logical replication slot into the change buffers.

One slot and one publication per database. The decoder streams the slot over
psycopg2's replication connection (psycopg 3 cannot stream COPY_BOTH) and
writes every change into the same buffers the triggers fill — with the
source transaction's xid (widened to xid8), in commit order, by COPY — in
chunks while the transaction is being decoded, so memory stays bounded
whatever the size of a source transaction, into a COPY left open until the
transaction's commit, so the server stores rows while the next are decoded.

Binary mode (the default when possible): pgoutput sends binary values and
:mod:`pgtrickle.cdc.wal_rows` cuts binary COPY rows straight out of the
messages. Text mode (decoded by :mod:`pgtrickle.cdc.pgoutput`, text COPY)
when the server is older than 14, a column type lacks binary send/receive, or
a buffer column's type is not the one the WAL carries; met mid-stream, the
current source transaction is rolled back to its savepoint, the batch before
it committed, and the stream restarted in text mode (see below: a restart is
always safe).

Exactly once: the decoder keeps one PostgreSQL transaction open per batch of
source transactions; each source transaction's rows go under a savepoint.
The batch's rows and the decoder's progress
(``pgtrickle.pgt_decoder_state.flushed_lsn`` = end of the last commit in the
batch) commit together, and only then is the position confirmed to the
server. After a crash the server resends from its confirmed position, which
is never past ``flushed_lsn``; a resent transaction ending at or before
``flushed_lsn`` is rolled back to its savepoint at its commit: nothing is
lost, nothing written twice.

Refreshes synchronise with the decoder through a non-transactional logical
message: :func:`wait_for_decoder` emits one *after* taking its snapshot and
waits until the decoder's progress passes it; then every transaction visible
in that snapshot is in the buffers.
"""

from __future__ import annotations

import contextlib
import logging
import re
import select
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from pgtrickle import faults
from pgtrickle.cdc import pgoutput
from pgtrickle.cdc.buffers import rows_table
from pgtrickle.cdc.wal_rows import (
    COPY_HEADER,
    COPY_TRAILER,
    NULL_FIELD,
    BinaryPlan,
    ColumnTypes,
    NeedTextMode,
    Uncommon,
    WalCaptureError,
    append_row_checked,
    binary_problem,
    relid_of,
    row_prefix,
)
from pgtrickle.db.query import one_row, scalar

if TYPE_CHECKING:
    from psycopg2.extras import ReplicationCursor

log = logging.getLogger(__name__)

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


@dataclass
class _Txn:
    xid: int
    commit_time: datetime
    commit_us: int = 0  # the commit time as sent: microseconds since 2000-01-01 UTC
    count: int = 0
    savepoint: bool = False
    xid8: int = 0
    at: str = ""


@dataclass
class _Plan:
    """How to turn a relation's tuples into buffer rows (positions by column)."""

    positions: list[int | None]
    binary: BinaryPlan | None = None


_BEGIN_TIME = struct.Struct("!q")  # commit time of a Begin message, at byte 9

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


class WalDecoder:
    """Streams the slot into the change buffers until stopped.

    ``binary``: ``None`` (default) decodes in binary mode when the server and
    the captured columns allow it (see :mod:`pgtrickle.cdc.wal_rows`), else in
    text mode; ``False`` forces text mode.
    """

    def __init__(
        self,
        dsn: str,
        slot: str,
        publication: str = PUBLICATION,
        *,
        max_batch_changes: int = 50_000,
        flush_interval: float = 0.1,
        binary: bool | None = None,
    ) -> None:
        self.dsn = dsn
        self.slot = slot
        self.publication = publication
        self.max_batch_changes = max_batch_changes
        self.flush_interval = flush_interval
        self.binary_allowed = binary is not False
        self.binary = False  # the mode of the current stream
        self.text_reason: str | None = None  # why the last run decodes in text mode
        self.relations = pgoutput.RelationCache()
        self._plans: dict[int, _Plan] = {}
        self._tracked: dict[int, TrackedSource] = {}
        self._txn: _Txn | None = None
        self._pending: dict[int, list] = {}  # rows (text) or row pieces (binary) not yet sent, by relation
        self._pending_count = 0
        self._fast: dict[int, tuple[BinaryPlan, dict[int, bytes], list[bytes]]] = {}  # this transaction's
        self._checked: set[int] = set()  # relations whose buffer types were checked (and locked) in the batch
        self._notify: set[int] = (
            set()
        )  # relations the batch wrote changes of: NOTIFY pgtrickle_changes at commit
        self._copy: psycopg.Copy | None = None
        self._copy_relid: int | None = None
        self._copy_stack: contextlib.ExitStack | None = None
        self._reference_xid8 = 0
        self._batch_changes = 0
        self._progress = 0  # LSN the next flush records
        self.flushed_lsn = 0
        self.changes_written = 0
        self.error: BaseException | None = None
        self._sync_requested = False
        self._conn: psycopg.Connection | None = None
        self._cursor: ReplicationCursor | None = None

    # ---------------------------------------------------------------- setup
    def _load_tracked(self) -> None:
        assert self._conn is not None
        self._end_copy()
        rows = self._conn.execute(
            "SELECT source_relid::bigint, buffer_name, columns FROM pgtrickle.pgt_change_sources"
            " WHERE source_kind = 'TABLE'"
        ).fetchall()
        self._tracked = {
            int(relid): TrackedSource(
                int(relid),
                buffer,
                [(c["name"], c["buf"]) for c in cols],
                [tuple(c.get("former", ())) for c in cols],
            )
            for relid, buffer, cols in rows
        }
        self._plans.clear()
        self._fast.clear()
        self._checked.clear()
        if self.binary:
            problem = self._source_problem()
            if problem:
                raise NeedTextMode(problem)

    def _source_problem(self) -> str | None:
        """Why the walsender could not send every column of the tracked sources in binary, if so."""
        assert self._conn is not None
        if not self._tracked:
            return None
        rows = self._conn.execute(_COLUMN_TYPES_SQL, ([str(r) for r in self._tracked],)).fetchall()
        for relid, name, _, binary_io in rows:
            if not binary_io:
                return f"column {name!r} of relation {relid} has a type without binary send/receive functions"
        return None

    def buffer_table(self, source: TrackedSource) -> sql.Identifier:
        """The table the decoder writes a source's changes to (the one place that names it)."""
        return rows_table(source.buffer_name)

    def _choose_mode(self) -> None:
        """Binary or text for this run; the reason for text is logged once."""
        assert self._conn is not None
        reason = None
        if not self.binary_allowed:
            reason = "text mode was asked for"
        elif self._conn.info.server_version < 140000:
            reason = "the server is older than PostgreSQL 14 (no binary pgoutput)"
        else:
            reason = self._source_problem()
        self.binary = reason is None
        if reason is not None and reason != self.text_reason:
            log.info("WAL decoder: text mode: %s", reason)
        self.text_reason = reason

    def _plan(self, relid: int) -> _Plan:
        plan = self._plans.get(relid)
        if plan is None:
            relation = self.relations.get(relid)
            index = {c.name: i for i, c in enumerate(relation.columns)}
            source = self._tracked[relid]
            positions: list[int | None] = []
            for (name, _), former in zip(source.columns, source.former_names, strict=True):
                # A change decoded after a rename carries the name of its time.
                candidates = [name, *reversed(former)]
                positions.append(next((index[n] for n in candidates if n in index), None))
            plan = _Plan(positions, BinaryPlan(positions, len(relation.columns)) if self.binary else None)
            self._plans[relid] = plan
        return plan

    def _check_buffer(self, relid: int) -> None:
        """Binary mode, first rows of a relation in this batch: lock its buffer, check its column types.

        The lock keeps the types until the batch commits; the buffer columns must
        have the types the WAL carries (an ALTER COLUMN ... TYPE may have changed
        them since these changes were written), with binary send/receive.
        """
        conn = self._conn
        assert conn is not None
        self._end_copy()
        source = self._tracked[relid]
        plan = self._plan(relid)
        table = self.buffer_table(source)
        conn.execute(sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE").format(table))
        types = {
            name: (typ, ok)
            for _, name, typ, ok in conn.execute(_COLUMN_TYPES_SQL, ([table.as_string(conn)],)).fetchall()
        }
        relation = self.relations.get(relid)
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
        for (name, buf), pos in zip(source.columns, plan.positions, strict=True):
            new, old = types.get(f"new_{buf}"), types.get(f"old_{buf}")
            if new is not None and old is not None and new[0] == old[0]:
                stored, binary = new[0], bool(new[1] and old[1])
            else:
                stored, binary = None, False
            wal_type = relation.columns[pos].type_oid if pos is not None else None
            columns.append(
                ColumnTypes(
                    name, base.get(wal_type, wal_type) if wal_type is not None else None, stored, binary
                )
            )
        problem = binary_problem(columns)
        if problem:
            raise NeedTextMode(f"relation {relid}: {problem}")
        self._checked.add(relid)

    def _is_tracked(self, relid: int) -> bool:
        if relid not in self._tracked:
            self._load_tracked()
        return relid in self._tracked

    # ------------------------------------------------------------- messages
    def _values(
        self, relid: int, tup: pgoutput.TupleData | None, fallback: pgoutput.TupleData | None
    ) -> list[str | None]:
        plan = self._plan(relid)
        if tup is None:
            return [None] * len(plan.positions)
        out: list[str | None] = []
        for pos in plan.positions:
            if pos is None:
                out.append(None)
                continue
            kind, value = tup[pos]
            if kind == "t":
                out.append(value)  # type: ignore[arg-type]  # kind "t": a text value, a str
            elif kind == "n":
                out.append(None)
            elif kind == "u":
                if fallback is None or fallback[pos].kind not in ("t", "n"):
                    raise WalCaptureError(
                        f"an UPDATE of relation {relid} left a TOASTed column unchanged and no old value "
                        "was sent; the source needs REPLICA IDENTITY FULL"
                    )
                out.append(fallback[pos].value)  # type: ignore[arg-type]  # kind "t" or "n": a str or None
            else:
                raise WalCaptureError("binary pgoutput values are not expected (binary = false)")
        return out

    CHUNK_ROWS = 10_000
    """Rows (text mode) held in memory before they are sent to the buffer's COPY."""
    BINARY_CHUNK_ROWS = 2_000
    """Rows (binary mode) held before they are sent: small enough that the server's COPY
    works while the next rows are decoded."""

    def _start_rows(self, txn: _Txn) -> None:
        """First tracked change of a source transaction: savepoint, xid8, commit time."""
        assert self._conn is not None
        if not txn.savepoint:
            self._end_copy()
            low = self._reference_xid8 & 0xFFFFFFFF
            if self._reference_xid8 == 0 or txn.xid > low or low - txn.xid >= 1 << 31:
                self._reference_xid8 = int(
                    scalar(self._conn, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text")
                )
            txn.xid8 = widen_xid(txn.xid, self._reference_xid8)
            txn.at = txn.commit_time.isoformat()
            self._conn.execute("SAVEPOINT pgt_txn")
            txn.savepoint = True

    def _add(
        self, relid: int, action: str, new: list[str | None] | None, old: list[str | None] | None
    ) -> None:
        """A text-mode row (or, in binary mode, a TRUNCATE)."""
        txn = self._txn
        assert txn is not None
        self._start_rows(txn)
        width = len(self._tracked[relid].columns)
        if self.binary:
            self._pending.setdefault(relid, []).append(
                row_prefix(width, txn.xid8, action, txn.commit_us) + NULL_FIELD * (2 * width)
            )
        else:
            self._pending.setdefault(relid, []).append(
                (txn.xid8, action, txn.at, *(new or [None] * width), *(old or [None] * width))
            )
        txn.count += 1
        self._pending_count += 1
        if self._pending_count >= self.CHUNK_ROWS:
            self._write_pending()

    def _fast_target(self, relid: int) -> tuple[BinaryPlan, dict[int, bytes], list[bytes]] | None:
        """Binary mode: plan, row prefix by message type and pending pieces of a relation, this transaction."""
        txn = self._txn
        assert txn is not None
        if not self._is_tracked(relid):
            return None
        self._start_rows(txn)
        plan = self._plan(relid).binary
        assert plan is not None
        if relid not in self._checked:
            self._check_buffer(relid)
        prefixes = {ord(a): row_prefix(plan.width, txn.xid8, a, txn.commit_us) for a in "IUD"}
        target = (plan, prefixes, self._pending.setdefault(relid, []))
        self._fast[relid] = target
        return target

    def _write_pending(self) -> None:
        """Send the pending rows to their buffers' COPY (opened as needed, left open)."""
        for relid, rows in self._pending.items():
            if not rows:
                continue
            copy = self._open_copy(relid)
            if self.binary:
                copy.write(b"".join(rows))
            else:
                for row in rows:
                    copy.write_row(row)
            rows.clear()  # in place: _fast holds the list
        self._pending_count = 0

    def _open_copy(self, relid: int) -> psycopg.Copy:
        if self._copy_relid == relid:
            assert self._copy is not None
            return self._copy
        self._end_copy()
        conn = self._conn
        assert conn is not None
        self._notify.add(relid)
        source = self._tracked[relid]
        cols = ["xid", "action", "captured_at"]
        cols += [f"new_{buf}" for _, buf in source.columns]
        cols += [f"old_{buf}" for _, buf in source.columns]
        stmt = sql.SQL("COPY {} ({}) FROM STDIN{}").format(
            self.buffer_table(source),
            sql.SQL(", ").join(map(sql.Identifier, cols)),
            sql.SQL(" (FORMAT binary)" if self.binary else ""),
        )
        stack = contextlib.ExitStack()
        copy = stack.enter_context(conn.cursor().copy(stmt))
        if self.binary:
            copy.write(COPY_HEADER)
        self._copy, self._copy_relid, self._copy_stack = copy, relid, stack
        return copy

    def _end_copy(self, error: BaseException | None = None) -> None:
        """Finish the open COPY (the server has then stored every row), or abort it with ``error``."""
        stack = self._copy_stack
        if stack is None:
            return
        copy = self._copy
        self._copy = self._copy_relid = self._copy_stack = None
        if error is None:
            if self.binary:
                assert copy is not None, "a COPY stack holds its COPY"
                copy.write(COPY_TRAILER)
            stack.close()
        else:
            stack.__exit__(type(error), error, error.__traceback__)

    def _drop_txn(self) -> None:
        """Forget the current source transaction's rows: abort the COPY, roll back to its savepoint."""
        txn, self._txn = self._txn, None
        self._pending.clear()
        self._pending_count = 0
        self._fast.clear()
        self._end_copy(NeedTextMode("the transaction's rows are discarded"))
        if txn is not None and txn.savepoint:
            assert self._conn is not None
            self._conn.execute("ROLLBACK TO SAVEPOINT pgt_txn")
            self._checked.clear()  # the rollback released the locks taken since the savepoint

    def handle(self, payload: bytes) -> None:
        """Process one pgoutput message."""
        tag = payload[0]
        if self.binary and (tag == 0x49 or tag == 0x55 or tag == 0x44):  # Insert, Update, Delete
            # Binary mode: the buffer row straight from the message bytes.
            txn = self._txn
            if txn is None:
                return
            (relid,) = relid_of(payload, 1)
            target = self._fast.get(relid)
            if target is None:
                target = self._fast_target(relid)
                if target is None:
                    return
            plan, prefixes, out = target
            try:
                plan.cut[tag](payload, out, prefixes[tag])
            except Uncommon:
                append_row_checked(out, payload, relid, plan, prefixes[tag])
            txn.count += 1
            self._pending_count += 1
            if self._pending_count >= self.BINARY_CHUNK_ROWS:
                self._write_pending()
            return
        message = pgoutput.decode_message(payload)
        # isinstance, not a dict of handlers: it narrows ``message`` for the type checker, and the
        # message classes have no subclasses.
        if isinstance(message, (pgoutput.Insert, pgoutput.Update, pgoutput.Delete)):
            relid = message.relid
            if self._txn is None or not self._is_tracked(relid):
                return
            if isinstance(message, pgoutput.Insert):
                self._add(relid, "I", self._values(relid, message.new, None), None)
            elif isinstance(message, pgoutput.Update):
                old = message.old
                if old is None:
                    raise WalCaptureError(
                        f"an UPDATE of relation {relid} arrived without its old row; the source needs "
                        "REPLICA IDENTITY FULL"
                    )
                self._add(relid, "U", self._values(relid, message.new, old), self._values(relid, old, None))
            else:
                old = message.old
                if old is None:
                    raise WalCaptureError(
                        f"a DELETE of relation {relid} arrived without its old row; the source needs "
                        "REPLICA IDENTITY FULL"
                    )
                self._add(relid, "D", None, self._values(relid, old, None))
        elif isinstance(message, pgoutput.Begin):
            self._txn = _Txn(message.xid, message.commit_time, _BEGIN_TIME.unpack_from(payload, 9)[0])
            self._fast.clear()
        elif isinstance(message, pgoutput.Commit):
            end = message.end_lsn
            assert self._conn is not None
            if end <= self.flushed_lsn:
                # Resent after a restart: already in the buffers.
                self._drop_txn()
                return
            txn, self._txn = self._txn, None
            self._fast.clear()
            if txn is not None and txn.savepoint:
                self._write_pending()
                self._end_copy()
                self._conn.execute("RELEASE SAVEPOINT pgt_txn")
                self._batch_changes += txn.count
            self._progress = max(self._progress, end)
        elif isinstance(message, pgoutput.Relation):
            # Sent before a relation's first change and again after its schema changed
            # (column renamed, added, dropped): re-read what is captured and under which names.
            self.relations.add(message)
            if self._txn is None or not self._txn.count:
                self._load_tracked()
            else:
                relid = message.relid
                self._plans.pop(relid, None)
                self._fast.pop(relid, None)
                self._checked.discard(relid)
        elif isinstance(message, pgoutput.Truncate):
            if self._txn is None:
                return
            for relid in message.relids:
                if self._is_tracked(relid):
                    self._add(relid, "T", None, None)
        elif (
            isinstance(message, pgoutput.LogicalMessage)
            and not message.transactional
            and message.prefix == SYNC_PREFIX
        ):
            self._progress = max(self._progress, message.lsn)
            self._sync_requested = True

    # ----------------------------------------------------------------- flush
    def flush(self) -> None:
        """Commit the batch with the progress in one transaction, then confirm to the server.

        Only between source transactions (every row of the batch is written).
        """
        if self._progress <= self.flushed_lsn:
            return
        conn = self._conn
        assert conn is not None and self._txn is None
        conn.execute(
            "UPDATE pgtrickle.pgt_decoder_state SET flushed_lsn = %s::pg_lsn,"
            " changes_total = changes_total + %s, updated_at = now() WHERE slot_name = %s",
            (pgoutput.lsn_to_str(self._progress), self._batch_changes, self.slot),
        )
        if self._notify and self._batch_changes:
            # Wakes the daemon (scheduler/wake.py), as a capture trigger does; sent at the commit.
            conn.execute(
                "SELECT pg_notify('pgtrickle_changes', r::text) FROM unnest(%s::oid[]) r",
                (sorted(self._notify),),
            )
        faults.point("wal.before_flush")
        conn.commit()
        self._notify.clear()
        faults.point("wal.after_flush")
        self._checked.clear()  # the commit released the buffer locks
        self.flushed_lsn = self._progress
        self.changes_written += self._batch_changes
        self._batch_changes = 0
        if self._cursor is not None:
            self._cursor.send_feedback(write_lsn=self.flushed_lsn, flush_lsn=self.flushed_lsn, force=True)

    # ------------------------------------------------------------------ loop
    def run(
        self, stop: threading.Event | None = None, until_lsn: int | None = None, timeout: float | None = None
    ) -> None:
        """Stream until ``stop`` is set, or until progress reaches ``until_lsn``.

        A binary stream that meets something binary rows cannot carry is
        abandoned at the current source transaction (rolled back to its
        savepoint), the batch before it committed, and streaming restarts in
        text mode from the flushed position.
        """
        stop = stop or threading.Event()
        deadline = time.monotonic() + timeout if timeout is not None else None
        self._conn = psycopg.connect(self.dsn, application_name="pgtrickle-wal-decoder")
        try:
            row = self._conn.execute(
                "SELECT flushed_lsn::text FROM pgtrickle.pgt_decoder_state WHERE slot_name = %s", (self.slot,)
            ).fetchone()
            if row is None:
                raise WalCaptureError(f"no decoder state for slot {self.slot}; is WAL capture set up?")
            self.flushed_lsn = self._progress = pgoutput.str_to_lsn(row[0])
            self.binary = False
            self._load_tracked()
            self._choose_mode()
            self._conn.commit()
            while True:
                try:
                    self._stream(stop, until_lsn, deadline, timeout)
                    return
                except NeedTextMode as exc:
                    if not self.binary:
                        raise
                    log.warning("WAL decoder: %s; restarting in text mode", exc.reason)
                    self.text_reason = exc.reason
                    self._drop_txn()
                    self.flush()
                    self.binary = False
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            self._copy = self._copy_relid = self._copy_stack = None
            self._conn.close()

    def _stream(
        self, stop: threading.Event, until_lsn: int | None, deadline: float | None, timeout: float | None
    ) -> None:
        import psycopg2
        import psycopg2.extras

        self.relations.clear()
        self._plans.clear()
        self._fast.clear()
        repl = psycopg2.connect(
            self.dsn,
            connection_factory=psycopg2.extras.LogicalReplicationConnection,
            application_name="pgtrickle-wal-decoder",
        )
        try:
            cur = repl.cursor()
            options = {"proto_version": "2", "publication_names": self.publication, "messages": "true"}
            if self.binary:
                options["binary"] = "true"
            cur.start_replication(slot_name=self.slot, decode=False, options=options)
            self._cursor = cur
            last_flush = time.monotonic()
            self._sync_requested = False
            read, handle = cur.read_message, self.handle
            count = 0
            while not stop.is_set():
                msg = read()
                while msg is not None:
                    handle(msg.payload)
                    if self._txn is None:  # between source transactions: flush when due
                        if (
                            self._batch_changes >= self.max_batch_changes
                            or self._sync_requested
                            or time.monotonic() - last_flush >= self.flush_interval
                        ):
                            self.flush()
                            self._sync_requested = False
                            last_flush = time.monotonic()
                        break
                    count += 1
                    if not count & 0x3FF and stop.is_set():
                        break
                    msg = read()
                if msg is not None:
                    continue
                if self._txn is None and self._progress > self.flushed_lsn:
                    self.flush()
                    last_flush = time.monotonic()
                if until_lsn is not None and self.flushed_lsn >= until_lsn:
                    return
                if deadline is not None and time.monotonic() > deadline:
                    raise WalCaptureError(
                        f"the WAL decoder did not reach {pgoutput.lsn_to_str(until_lsn or 0)} in {timeout}s"
                    )
                select.select([cur], [], [], 0.05)
        finally:
            self._cursor = None
            repl.close()


class DecoderThread:
    """Runs a :class:`WalDecoder` in a daemon thread, restarting it after errors."""

    def __init__(self, dsn: str, slot: str, on_error: Callable[[BaseException], None] | None = None) -> None:
        self.decoder = WalDecoder(dsn, slot)
        self.stop_event = threading.Event()
        self.on_error = on_error or (lambda exc: log.error("WAL decoder stopped: %s", exc))
        self.thread = threading.Thread(target=self._main, name="pgtrickle-wal-decoder", daemon=True)

    def start(self) -> None:
        self.thread.start()

    HEALTHY_SECONDS = 60.0
    """A run that streamed this long before failing starts the backoff over (a new incident)."""

    def _main(self) -> None:
        backoff = 0.5
        while not self.stop_event.is_set():
            started = time.monotonic()
            try:
                self.decoder.run(self.stop_event)
                return
            except Exception as exc:
                if time.monotonic() - started >= self.HEALTHY_SECONDS:
                    backoff = 0.5
                self.on_error(exc)
                log.warning("WAL decoder: retrying in %.1fs", backoff)
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                self.decoder = WalDecoder(self.decoder.dsn, self.decoder.slot)

    def stop(self, timeout: float = 30) -> None:
        self.stop_event.set()
        self.thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()


def decoder_slot(conn: psycopg.Connection) -> str | None:
    """The slot of this database's WAL capture, if it is set up."""
    row = conn.execute("SELECT slot_name FROM pgtrickle.pgt_decoder_state LIMIT 1").fetchone()
    return str(row[0]) if row else None


def wait_for_decoder(conn: psycopg.Connection, dsn: str, timeout: float = 60.0) -> None:
    """Return once every transaction committed before this call is in the buffers.

    No-op without WAL capture. When no decoder is attached to the slot (no
    daemon running), decode in this process until caught up.
    """
    slot = decoder_slot(conn)
    if slot is None:
        return
    target_text: str = scalar(conn, "SELECT pg_logical_emit_message(false, %s, '')::text", (SYNC_PREFIX,))
    target = pgoutput.str_to_lsn(target_text)
    deadline = time.monotonic() + timeout
    while True:
        flushed, active = one_row(
            conn.execute(
                "SELECT d.flushed_lsn::text, coalesce(s.active, false) FROM pgtrickle.pgt_decoder_state d"
                " LEFT JOIN pg_replication_slots s ON s.slot_name = d.slot_name WHERE d.slot_name = %s",
                (slot,),
            )
        )
        if pgoutput.str_to_lsn(flushed) >= target:
            return
        if not active:
            import psycopg2
            import psycopg2.errorcodes

            try:
                WalDecoder(dsn, slot).run(until_lsn=target, timeout=max(1.0, deadline - time.monotonic()))
                return
            except psycopg2.OperationalError as exc:
                # A decoder thread attached to the slot meanwhile (the slot is in use): wait for it instead.
                if exc.pgcode != psycopg2.errorcodes.OBJECT_IN_USE:
                    raise WalCaptureError(f"the WAL decoder could not run: {exc}") from exc
        if time.monotonic() > deadline:
            raise WalCaptureError(
                f"the WAL decoder has not caught up with {target_text} after {timeout:.0f}s "
                f"(it is at {flushed}); see pgtrickle.check_cdc_health()"
            )
        time.sleep(0.01)
