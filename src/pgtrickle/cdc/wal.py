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

Modules: this one runs the decoder (:class:`DecoderThread`) and waits for it
(:func:`wait_for_decoder`), and re-exports the names of the others:
:mod:`~pgtrickle.cdc.wal_decoder` (the stream, the batches, the savepoints),
:mod:`~pgtrickle.cdc.wal_copy` (the open COPY into a buffer),
:mod:`~pgtrickle.cdc.wal_catalog` (slot, publication, tracked sources, their
column types) and :mod:`~pgtrickle.cdc.wal_rows` (buffer rows from messages).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import psycopg

from pgtrickle.cdc import pgoutput
from pgtrickle.cdc.wal_catalog import (
    PUBLICATION,
    SYNC_PREFIX,
    TrackedSource,
    decoder_slot,
    slot_name_for,
    widen_xid,
)
from pgtrickle.cdc.wal_decoder import WalDecoder
from pgtrickle.cdc.wal_rows import WalCaptureError
from pgtrickle.db.query import one_row, scalar

__all__ = [
    "PUBLICATION",
    "SYNC_PREFIX",
    "DecoderThread",
    "TrackedSource",
    "WalCaptureError",
    "WalDecoder",
    "decoder_slot",
    "slot_name_for",
    "wait_for_decoder",
    "widen_xid",
]

log = logging.getLogger(__name__)


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
