"""Which capture a source should use, and carrying out the change.

``cdc_mode`` is ``trigger``, ``auto`` or ``wal``: a global default (setting
``cdc_mode``) that a source's own setting (``pgtrickle.set_cdc_mode``)
overrides. Sources are always created with triggers, so creating a stream
table stays one atomic transaction. ``auto`` moves a source to WAL capture
after the first successful refresh of a stream table reading it; ``wal``
moves it as soon as the daemon can. When WAL capture is not possible
(``wal_level`` is not ``logical``, the slot cannot be made, the decoder does
not catch up in time) the source stays on triggers and the reason is
recorded — changes are never lost either way. A partitioned table or an
inheritance parent stays on triggers (:func:`hierarchy_blocker`): its trigger
capture follows every partition and child, WAL capture here does not.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from enum import StrEnum

import psycopg

from pgtrickle.cdc import pgoutput
from pgtrickle.cdc.wal import PUBLICATION, SYNC_PREFIX, slot_name_for
from pgtrickle.db.query import one_row, scalar

log = logging.getLogger(__name__)


class Move(StrEnum):
    TO_WAL = "to_wal"
    TO_TRIGGER = "to_trigger"


@dataclass(frozen=True)
class SourceCapture:
    relid: int
    name: str
    current: str  # 'trigger' | 'wal'
    setting: str  # 'default' | 'trigger' | 'auto' | 'wal'
    consumer_refreshed: bool  # some stream table reading it has completed a refresh
    reason: str | None
    members: int = 0  # partitions / inheritance children below it, at any depth


def desired_move(source: SourceCapture, default_mode: str) -> Move | None:
    """Should this source change its capture now? (pure)"""
    wanted = default_mode if source.setting == "default" else source.setting
    if wanted == "trigger":
        return Move.TO_TRIGGER if source.current == "wal" else None
    if source.current == "wal":
        return None
    if wanted == "wal" or (wanted == "auto" and source.consumer_refreshed):
        return Move.TO_WAL
    return None


def wal_blocker(wal_level: str, max_replication_slots: int, slots_in_use: int, has_slot: bool) -> str | None:
    """Why WAL capture cannot be set up here, or ``None`` (pure)."""
    if wal_level != "logical":
        return f"wal_level is {wal_level!r}, not 'logical' (set it and restart PostgreSQL to use WAL capture)"
    if not has_slot and slots_in_use >= max_replication_slots:
        return (
            f"all {max_replication_slots} replication slots are in use "
            "(raise max_replication_slots to use WAL capture)"
        )
    return None


def hierarchy_blocker(members: int) -> str | None:
    """Why a source with partitions or inheritance children stays on triggers, or ``None`` (pure).

    The decoder maps published relations to sources one to one; a write on a
    partition or child is published under that table, and REPLICA IDENTITY
    FULL would have to follow every member attached later. The trigger
    capture covers them all (capture_hierarchy.sql).
    """
    if members:
        return (
            f"the table has {members} partition(s) or inheritance child(ren): WAL capture does not follow "
            "them, trigger capture does"
        )
    return None


def load_sources(conn: psycopg.Connection) -> list[SourceCapture]:
    rows = conn.execute(
        """
        SELECT c.source_relid::bigint, c.source_schema || '.' || c.source_name, c.cdc_mode,
               c.cdc_mode_setting,
               EXISTS (SELECT 1 FROM pgtrickle.pgt_dependencies d JOIN pgtrickle.pgt_stream_tables s
                         USING (pgt_id) WHERE d.source_relid = c.source_relid AND s.frontier IS NOT NULL),
               c.cdc_reason,
               (SELECT count(*) FROM pgtrickle._hierarchy_members(c.source_relid))
          FROM pgtrickle.pgt_change_sources c
         WHERE c.source_kind = 'TABLE'
         ORDER BY c.source_relid
        """
    ).fetchall()
    return [SourceCapture(int(r[0]), r[1], r[2], r[3], bool(r[4]), r[5], int(r[6])) for r in rows]


def default_mode(conn: psycopg.Connection) -> str:
    row = conn.execute("SELECT value FROM pgtrickle.pgt_settings WHERE name = 'cdc_mode'").fetchone()
    value = (row[0] if row else "trigger").strip().lower()
    return value if value in ("trigger", "auto", "wal") else "trigger"


def _setting_seconds(conn: psycopg.Connection, name: str, default: float) -> float:
    row = conn.execute(
        "SELECT extract(epoch FROM value::interval) FROM pgtrickle.pgt_settings WHERE name = %s", (name,)
    ).fetchone()
    return float(row[0]) if row and row[0] is not None else default


def ensure_wal_infrastructure(conn: psycopg.Connection) -> str:
    """Create the publication and the slot if missing; returns the slot name.

    Raises psycopg errors when PostgreSQL refuses (the caller records why).
    ``conn`` must be in autocommit mode: a slot cannot be created in a
    transaction that has written anything.
    """
    dbname = scalar(conn, "SELECT current_database()")
    slot = slot_name_for(dbname)
    if not conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (PUBLICATION,)).fetchone():
        conn.execute(f"CREATE PUBLICATION {PUBLICATION} WITH (publish = 'insert, update, delete, truncate')")
    state = conn.execute("SELECT 1 FROM pgtrickle.pgt_decoder_state WHERE slot_name = %s", (slot,)).fetchone()
    exists = conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    if not exists:
        lsn = scalar(
            conn, "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,)
        )
        conn.execute(
            "INSERT INTO pgtrickle.pgt_decoder_state (slot_name, publication, flushed_lsn) VALUES (%s, %s, %s)"
            " ON CONFLICT (slot_name) DO UPDATE SET flushed_lsn = excluded.flushed_lsn, updated_at = now()",
            (slot, PUBLICATION, lsn),
        )
    elif not state:
        lsn = scalar(
            conn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        )
        conn.execute(
            "INSERT INTO pgtrickle.pgt_decoder_state (slot_name, publication, flushed_lsn) "
            "VALUES (%s, %s, %s)",
            (slot, PUBLICATION, lsn),
        )
    return slot


def decoder_caught_up(conn: psycopg.Connection, slot: str, timeout: float) -> bool:
    """Whether the running decoder reaches the current WAL position within ``timeout``."""
    target = pgoutput.str_to_lsn(
        scalar(conn, "SELECT pg_logical_emit_message(false, %s, '')::text", (SYNC_PREFIX,))
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT flushed_lsn::text FROM pgtrickle.pgt_decoder_state WHERE slot_name = %s", (slot,)
        ).fetchone()
        if row and pgoutput.str_to_lsn(row[0]) >= target:
            return True
        time.sleep(0.02)
    return False


class CaptureManager:
    """Applies :func:`desired_move` to every source; used by the daemon each tick."""

    RETRY_SECONDS = 300.0

    def __init__(self, conn: psycopg.Connection, start_decoder) -> None:
        self.conn = conn
        self.start_decoder = start_decoder  # () -> None: make sure a decoder runs for the slot
        self._retry_after: dict[int, float] = {}

    def _fallback(self, source: SourceCapture, reason: str) -> None:
        if source.reason != reason:
            log.warning("%s stays on trigger capture: %s", source.name, reason)
            self.conn.execute("SELECT pgtrickle._transition_to_trigger(%s, %s)", (source.relid, reason))
            self.conn.execute(
                "SELECT pg_notify('pg_trickle_cdc_transition', %s)",
                (
                    json.dumps(
                        {
                            "event": "cdc_transition_failed",
                            "source": source.name,
                            "from": "trigger",
                            "to": "wal",
                            "reason": reason,
                        }
                    ),
                ),
            )

    def reconcile(self) -> list[tuple[str, Move, str]]:
        done: list[tuple[str, Move, str]] = []
        default = default_mode(self.conn)
        for source in load_sources(self.conn):
            try:
                self._reconcile_one(source, default, done)
            except psycopg.Error:
                if self.conn.broken or self.conn.closed:
                    raise
                # One source (its capture objects dropped by hand, say) must not stop the others.
                log.exception(
                    "%s: changing its capture failed; retrying in %.0fs", source.name, self.RETRY_SECONDS
                )
                self._retry_after[source.relid] = time.monotonic() + self.RETRY_SECONDS
        return done

    def _reconcile_one(self, source: SourceCapture, default: str, done: list[tuple[str, Move, str]]) -> None:
        move = desired_move(source, default)
        if move is Move.TO_TRIGGER:
            reason = "cdc_mode is trigger"
            self.conn.execute("SELECT pgtrickle._transition_to_trigger(%s, %s)", (source.relid, reason))
            done.append((source.name, move, reason))
        elif move is Move.TO_WAL:
            if time.monotonic() < self._retry_after.get(source.relid, 0.0):
                return
            result = self._to_wal(source)
            if result is None:
                self._retry_after[source.relid] = time.monotonic() + self.RETRY_SECONDS
            if result:
                done.append((source.name, move, result))

    def _to_wal(self, source: SourceCapture) -> str | None:
        hierarchy = hierarchy_blocker(source.members)
        if hierarchy:
            self._fallback(source, hierarchy)
            return None
        wal_level, max_slots, in_use, has_slot = one_row(
            self.conn.execute(
                "SELECT current_setting('wal_level'), current_setting('max_replication_slots')::int,"
                " (SELECT count(*) FROM pg_replication_slots),"
                " EXISTS (SELECT 1 FROM pg_replication_slots s JOIN pgtrickle.pgt_decoder_state d USING (slot_name))"
            )
        )
        blocker = wal_blocker(wal_level, max_slots, in_use, has_slot)
        if blocker:
            self._fallback(source, blocker)
            return None
        try:
            slot = ensure_wal_infrastructure(self.conn)
        except psycopg.Error as exc:
            self._fallback(source, f"the replication slot could not be created: {str(exc).splitlines()[0]}")
            return None
        self.start_decoder()
        timeout = _setting_seconds(self.conn, "wal_transition_timeout", 30.0)
        if not decoder_caught_up(self.conn, slot, timeout):
            self._fallback(source, f"the WAL decoder did not catch up within {timeout:g}s")
            return None
        reason = (
            "cdc_mode is wal"
            if source.setting == "wal"
            else "cdc_mode auto: moved to WAL after the first refresh"
        )
        self.conn.execute(
            "SELECT pgtrickle._transition_to_wal(%s, %s, %s)", (source.relid, PUBLICATION, reason)
        )
        log.info("%s: change capture moved from triggers to WAL", source.name)
        return reason
