"""The WAL decoder: streams the replication slot and writes every captured change into its buffer.

How it keeps every change exactly once, and how refreshes wait for it, is in
:mod:`pgtrickle.cdc.wal`; binary buffer rows are cut by
:mod:`pgtrickle.cdc.wal_rows`, text-mode rows decoded by
:mod:`pgtrickle.cdc.pgoutput`.
"""

from __future__ import annotations

import logging
import select
import struct
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from pgtrickle import faults
from pgtrickle.cdc import pgoutput
from pgtrickle.cdc.wal_catalog import (
    PUBLICATION,
    SYNC_PREFIX,
    TrackedSource,
    binary_io_problem,
    buffer_column_types,
    tracked_sources,
    widen_xid,
)
from pgtrickle.cdc.wal_copy import BufferCopy, buffer_table
from pgtrickle.cdc.wal_rows import (
    NULL_FIELD,
    BinaryPlan,
    NeedTextMode,
    Uncommon,
    WalCaptureError,
    append_row_checked,
    binary_problem,
    relid_of,
    row_prefix,
    text_values,
)
from pgtrickle.db.query import scalar

if TYPE_CHECKING:
    from psycopg2.extras import LogicalReplicationConnection, ReplicationCursor

log = logging.getLogger(__name__)


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
        self._buffer_copy = BufferCopy()
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
        self._buffer_copy.end()
        self._tracked = tracked_sources(self._conn)
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
        return binary_io_problem(self._conn, list(self._tracked))

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
        self._buffer_copy.end()
        source = self._tracked[relid]
        plan = self._plan(relid)
        table = buffer_table(source)
        conn.execute(sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE").format(table))
        columns = buffer_column_types(conn, table, source, self.relations.get(relid), plan.positions)
        problem = binary_problem(columns)
        if problem:
            raise NeedTextMode(f"relation {relid}: {problem}")
        self._checked.add(relid)

    def _is_tracked(self, relid: int) -> bool:
        if relid not in self._tracked:
            self._load_tracked()
        return relid in self._tracked

    # ------------------------------------------------------------- messages
    def _text_values(
        self, relid: int, tup: pgoutput.TupleData | None, fallback: pgoutput.TupleData | None
    ) -> list[str | None]:
        return text_values(relid, self._plan(relid).positions, tup, fallback)

    CHUNK_ROWS = 10_000
    """Rows (text mode) held in memory before they are sent to the buffer's COPY."""
    BINARY_CHUNK_ROWS = 2_000
    """Rows (binary mode) held before they are sent: small enough that the server's COPY
    works while the next rows are decoded."""

    def _start_rows(self, txn: _Txn) -> None:
        """First tracked change of a source transaction: savepoint, xid8, commit time."""
        assert self._conn is not None
        if not txn.savepoint:
            self._buffer_copy.end()
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
            assert self._conn is not None
            self._notify.add(relid)
            copy = self._buffer_copy.open(self._conn, relid, self._tracked[relid], self.binary)
            if self.binary:
                copy.write(b"".join(rows))
            else:
                for row in rows:
                    copy.write_row(row)
            rows.clear()  # in place: _fast holds the list
        self._pending_count = 0

    def _drop_txn(self) -> None:
        """Forget the current source transaction's rows: abort the COPY, roll back to its savepoint."""
        txn, self._txn = self._txn, None
        self._pending.clear()
        self._pending_count = 0
        self._fast.clear()
        self._buffer_copy.end(NeedTextMode("the transaction's rows are discarded"))
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
                self._add(relid, "I", self._text_values(relid, message.new, None), None)
            elif isinstance(message, pgoutput.Update):
                old = message.old
                if old is None:
                    raise WalCaptureError(
                        f"an UPDATE of relation {relid} arrived without its old row; the source needs "
                        "REPLICA IDENTITY FULL"
                    )
                self._add(
                    relid,
                    "U",
                    self._text_values(relid, message.new, old),
                    self._text_values(relid, old, None),
                )
            else:
                old = message.old
                if old is None:
                    raise WalCaptureError(
                        f"a DELETE of relation {relid} arrived without its old row; the source needs "
                        "REPLICA IDENTITY FULL"
                    )
                self._add(relid, "D", None, self._text_values(relid, old, None))
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
                self._buffer_copy.end()
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
            restarting = False
            while True:
                try:
                    self._stream(stop, until_lsn, deadline, timeout, restarting)
                    return
                except NeedTextMode as exc:
                    if not self.binary:
                        raise
                    log.warning("WAL decoder: %s; restarting in text mode", exc.reason)
                    self.text_reason = exc.reason
                    self._drop_txn()
                    self.flush()
                    self.binary = False
                    restarting = True
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            self._buffer_copy.forget()
            self._conn.close()

    RESTART_SLOT_WAIT = 10.0
    """Seconds a restart waits for the walsender of its own previous stream to release the slot."""

    def _open_stream(self, restarting: bool) -> tuple[LogicalReplicationConnection, ReplicationCursor]:
        """A replication connection streaming from the slot, and its cursor.

        The walsender of a closed stream releases the slot a moment after the
        client has gone; a restart (text mode) waits for that instead of failing
        with "replication slot is active". A first start fails at once: another
        decoder holding the slot is what callers must learn.
        """
        import psycopg2
        import psycopg2.errorcodes
        import psycopg2.extras

        options = {"proto_version": "2", "publication_names": self.publication, "messages": "true"}
        if self.binary:
            options["binary"] = "true"
        give_up = time.monotonic() + (self.RESTART_SLOT_WAIT if restarting else 0.0)
        while True:
            repl = psycopg2.connect(
                self.dsn,
                connection_factory=psycopg2.extras.LogicalReplicationConnection,
                application_name="pgtrickle-wal-decoder",
            )
            try:
                cur = repl.cursor()
                cur.start_replication(slot_name=self.slot, decode=False, options=options)
                return repl, cur
            except psycopg2.OperationalError as exc:
                repl.close()
                if exc.pgcode != psycopg2.errorcodes.OBJECT_IN_USE or time.monotonic() >= give_up:
                    raise
                time.sleep(0.05)

    def _stream(
        self,
        stop: threading.Event,
        until_lsn: int | None,
        deadline: float | None,
        timeout: float | None,
        restarting: bool = False,
    ) -> None:
        self.relations.clear()
        self._plans.clear()
        self._fast.clear()
        repl, cur = self._open_stream(restarting)
        try:
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
