"""WAL change capture: decode ``pgoutput`` from a logical replication slot into the change buffers.

One slot and one publication per database. The decoder streams the slot over
psycopg2's replication connection (psycopg 3 cannot stream COPY_BOTH) and
writes every change into the same buffers the triggers fill — with the
source transaction's xid (widened to xid8), in commit order, by COPY — in
chunks while the transaction is being decoded, so memory stays bounded
whatever the size of a source transaction.

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

import logging
import re
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import psycopg
from psycopg import sql

from pgtrickle import faults
from pgtrickle.cdc import pgoutput
from pgtrickle.cdc.buffers import rows_table
from pgtrickle.errors import PgTrickleError

log = logging.getLogger(__name__)

PUBLICATION = "pgtrickle_pub"
SYNC_PREFIX = "pgtrickle.sync"


class WalCaptureError(PgTrickleError):
    """WAL capture cannot proceed (no slot, decoder not running, bad replica identity…)."""


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
    count: int = 0
    savepoint: bool = False
    xid8: str = ""
    at: str = ""


@dataclass
class _Plan:
    """How to turn a relation's tuples into buffer rows (positions by column)."""

    positions: list[int | None]


class WalDecoder:
    """Streams the slot into the change buffers until stopped."""

    def __init__(self, dsn: str, slot: str, publication: str = PUBLICATION, *,
                 max_batch_changes: int = 50_000, flush_interval: float = 0.1) -> None:
        self.dsn = dsn
        self.slot = slot
        self.publication = publication
        self.max_batch_changes = max_batch_changes
        self.flush_interval = flush_interval
        self.relations = pgoutput.RelationCache()
        self._plans: dict[int, _Plan] = {}
        self._tracked: dict[int, TrackedSource] = {}
        self._txn: _Txn | None = None
        self._pending: dict[int, list[tuple]] = {}
        self._pending_count = 0
        self._reference_xid8 = 0
        self._batch_changes = 0
        self._progress = 0  # LSN the next flush records
        self.flushed_lsn = 0
        self.changes_written = 0
        self.error: BaseException | None = None
        self._sync_requested = False
        self._conn: psycopg.Connection | None = None
        self._cursor = None

    # ---------------------------------------------------------------- setup
    def _load_tracked(self) -> None:
        assert self._conn is not None
        rows = self._conn.execute(
            "SELECT source_relid::bigint, buffer_name, columns FROM pgtrickle.pgt_change_sources"
            " WHERE source_kind = 'TABLE'"
        ).fetchall()
        self._tracked = {
            int(relid): TrackedSource(int(relid), buffer, [(c["name"], c["buf"]) for c in cols],
                                      [tuple(c.get("former", ())) for c in cols])
            for relid, buffer, cols in rows
        }
        self._plans.clear()

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
            plan = _Plan(positions)
            self._plans[relid] = plan
        return plan

    def _is_tracked(self, relid: int) -> bool:
        if relid not in self._tracked:
            self._load_tracked()
        return relid in self._tracked

    # ------------------------------------------------------------- messages
    def _values(self, relid: int, tup: pgoutput.TupleData | None, fallback: pgoutput.TupleData | None
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
                out.append(value)  # type: ignore[arg-type]
            elif kind == "n":
                out.append(None)
            elif kind == "u":
                if fallback is None or fallback[pos].kind not in ("t", "n"):
                    raise WalCaptureError(
                        f"an UPDATE of relation {relid} left a TOASTed column unchanged and no old value "
                        "was sent; the source needs REPLICA IDENTITY FULL")
                out.append(fallback[pos].value)  # type: ignore[arg-type]
            else:
                raise WalCaptureError("binary pgoutput values are not expected (binary = false)")
        return out

    CHUNK_ROWS = 10_000
    """Rows held in memory before they are COPYed into the (still open) batch."""

    def _start_rows(self, txn: _Txn) -> None:
        """First tracked change of a source transaction: savepoint, xid8, commit time."""
        assert self._conn is not None
        if not txn.savepoint:
            low = self._reference_xid8 & 0xFFFFFFFF
            if self._reference_xid8 == 0 or txn.xid > low or low - txn.xid >= 1 << 31:
                self._reference_xid8 = int(self._conn.execute(
                    "SELECT pg_snapshot_xmax(pg_current_snapshot())::text").fetchone()[0])  # type: ignore[index]
            txn.xid8 = str(widen_xid(txn.xid, self._reference_xid8))
            txn.at = txn.commit_time.isoformat()
            self._conn.execute("SAVEPOINT pgt_txn")
            txn.savepoint = True

    def _add(self, relid: int, action: str, new: list[str | None] | None, old: list[str | None] | None) -> None:
        txn = self._txn
        assert txn is not None
        self._start_rows(txn)
        width = len(self._tracked[relid].columns)
        self._pending.setdefault(relid, []).append(
            (txn.xid8, action, txn.at, *(new or [None] * width), *(old or [None] * width)))
        txn.count += 1
        self._pending_count += 1
        if self._pending_count >= self.CHUNK_ROWS:
            self._write_pending()

    def _write_pending(self) -> None:
        conn = self._conn
        assert conn is not None
        for relid, rows in self._pending.items():
            source = self._tracked[relid]
            cols = ["xid", "action", "captured_at"]
            cols += [f"new_{buf}" for _, buf in source.columns]
            cols += [f"old_{buf}" for _, buf in source.columns]
            stmt = sql.SQL("COPY {} ({}) FROM STDIN").format(
                rows_table(source.buffer_name), sql.SQL(", ").join(map(sql.Identifier, cols)))
            with conn.cursor().copy(stmt) as copy:
                for row in rows:
                    copy.write_row(row)
        self._pending.clear()
        self._pending_count = 0

    def handle(self, payload: bytes) -> None:
        """Process one pgoutput message."""
        message = pgoutput.decode_message(payload)
        kind = type(message)
        if kind is pgoutput.Insert or kind is pgoutput.Update or kind is pgoutput.Delete:
            relid = message.relid  # type: ignore[union-attr]
            if self._txn is None or not self._is_tracked(relid):
                return
            if kind is pgoutput.Insert:
                self._add(relid, "I", self._values(relid, message.new, None), None)  # type: ignore[union-attr]
            elif kind is pgoutput.Update:
                old = message.old  # type: ignore[union-attr]
                if old is None:
                    raise WalCaptureError(
                        f"an UPDATE of relation {relid} arrived without its old row; the source needs "
                        "REPLICA IDENTITY FULL")
                self._add(relid, "U", self._values(relid, message.new, old),  # type: ignore[union-attr]
                          self._values(relid, old, None))
            else:
                old = message.old  # type: ignore[union-attr]
                if old is None:
                    raise WalCaptureError(
                        f"a DELETE of relation {relid} arrived without its old row; the source needs "
                        "REPLICA IDENTITY FULL")
                self._add(relid, "D", None, self._values(relid, old, None))
        elif kind is pgoutput.Begin:
            self._txn = _Txn(message.xid, message.commit_time)  # type: ignore[union-attr]
        elif kind is pgoutput.Commit:
            txn, self._txn = self._txn, None
            end = message.end_lsn  # type: ignore[union-attr]
            assert self._conn is not None
            if end <= self.flushed_lsn:
                # Resent after a restart: already in the buffers.
                self._pending.clear()
                self._pending_count = 0
                if txn is not None and txn.savepoint:
                    self._conn.execute("ROLLBACK TO SAVEPOINT pgt_txn")
                return
            if txn is not None and txn.savepoint:
                self._write_pending()
                self._conn.execute("RELEASE SAVEPOINT pgt_txn")
                self._batch_changes += txn.count
            self._progress = max(self._progress, end)
        elif kind is pgoutput.Relation:
            # Sent before a relation's first change and again after its schema changed
            # (column renamed, added, dropped): re-read what is captured and under which names.
            self.relations.add(message)  # type: ignore[arg-type]
            if self._txn is None or not self._txn.count:
                self._load_tracked()
            else:
                self._plans.pop(message.relid, None)  # type: ignore[union-attr]
        elif kind is pgoutput.Truncate:
            if self._txn is None:
                return
            for relid in message.relids:  # type: ignore[union-attr]
                if self._is_tracked(relid):
                    self._add(relid, "T", None, None)
        elif kind is pgoutput.LogicalMessage:
            if not message.transactional and message.prefix == SYNC_PREFIX:  # type: ignore[union-attr]
                self._progress = max(self._progress, message.lsn)  # type: ignore[union-attr]
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
        faults.point("wal.before_flush")
        conn.commit()
        faults.point("wal.after_flush")
        self.flushed_lsn = self._progress
        self.changes_written += self._batch_changes
        self._batch_changes = 0
        if self._cursor is not None:
            self._cursor.send_feedback(write_lsn=self.flushed_lsn, flush_lsn=self.flushed_lsn, force=True)

    # ------------------------------------------------------------------ loop
    def run(self, stop: threading.Event | None = None, until_lsn: int | None = None,
            timeout: float | None = None) -> None:
        """Stream until ``stop`` is set, or until progress reaches ``until_lsn``."""
        import psycopg2
        import psycopg2.extras

        stop = stop or threading.Event()
        deadline = time.monotonic() + timeout if timeout is not None else None
        self._conn = psycopg.connect(self.dsn, application_name="pgtrickle-wal-decoder")
        repl = None
        try:
            row = self._conn.execute(
                "SELECT flushed_lsn::text FROM pgtrickle.pgt_decoder_state WHERE slot_name = %s",
                (self.slot,)).fetchone()
            if row is None:
                raise WalCaptureError(f"no decoder state for slot {self.slot}; is WAL capture set up?")
            self.flushed_lsn = self._progress = pgoutput.str_to_lsn(row[0])
            self._load_tracked()
            self._conn.commit()
            repl = psycopg2.connect(self.dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection,
                                    application_name="pgtrickle-wal-decoder")
            cur = repl.cursor()
            cur.start_replication(
                slot_name=self.slot, decode=False,
                options={"proto_version": "2", "publication_names": self.publication, "messages": "true"},
            )
            self._cursor = cur
            last_flush = time.monotonic()
            self._sync_requested = False
            while not stop.is_set():
                msg = cur.read_message()
                if msg is not None:
                    self.handle(msg.payload)
                    if (self._batch_changes >= self.max_batch_changes or self._sync_requested
                            or time.monotonic() - last_flush >= self.flush_interval):
                        if self._txn is None:
                            self.flush()
                            self._sync_requested = False
                            last_flush = time.monotonic()
                    continue
                if self._txn is None and self._progress > self.flushed_lsn:
                    self.flush()
                    last_flush = time.monotonic()
                if until_lsn is not None and self.flushed_lsn >= until_lsn:
                    return
                if deadline is not None and time.monotonic() > deadline:
                    raise WalCaptureError(
                        f"the WAL decoder did not reach {pgoutput.lsn_to_str(until_lsn or 0)} in {timeout}s")
                select.select([cur], [], [], 0.05)
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            self._cursor = None
            if repl is not None:
                repl.close()
            self._conn.close()


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
            except Exception as exc:  # noqa: BLE001 - reported, then retried
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
    row = conn.execute("SELECT pg_logical_emit_message(false, %s, '')::text", (SYNC_PREFIX,)).fetchone()
    target = pgoutput.str_to_lsn(row[0])  # type: ignore[index]
    deadline = time.monotonic() + timeout
    while True:
        flushed, active = conn.execute(
            "SELECT d.flushed_lsn::text, coalesce(s.active, false) FROM pgtrickle.pgt_decoder_state d"
            " LEFT JOIN pg_replication_slots s ON s.slot_name = d.slot_name WHERE d.slot_name = %s",
            (slot,)).fetchone()  # type: ignore[misc]
        if pgoutput.str_to_lsn(flushed) >= target:
            return
        if not active:
            import psycopg2

            try:
                WalDecoder(dsn, slot).run(until_lsn=target, timeout=max(1.0, deadline - time.monotonic()))
                return
            except psycopg2.OperationalError as exc:
                # A decoder thread attached to the slot meanwhile: wait for it instead.
                if "is active" not in str(exc):
                    raise WalCaptureError(f"the WAL decoder could not run: {exc}") from exc
        if time.monotonic() > deadline:
            raise WalCaptureError(
                f"the WAL decoder has not caught up with {row[0]} after {timeout:.0f}s "  # type: ignore[index]
                f"(it is at {flushed}); see pgtrickle.check_cdc_health()")
        time.sleep(0.01)
