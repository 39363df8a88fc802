"""The circuit breaker at the edge: read its configuration and history, record trips.

The decision itself is :func:`pgtrickle.gates.circuit_breaker.should_trip`
(pure). This module runs inside the refresh's planning transaction, before
any Spark job: it counts nothing itself — it takes the pending counts the
plan already made (shared with the refresh plan, counted once).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from pgtrickle.catalog.store import StreamTable
from pgtrickle.cdc.buffers import PendingChanges
from pgtrickle.gates.circuit_breaker import BreakerConfig, TripDecision, Volume, should_trip
from pgtrickle.gates.skips import record_skip
from pgtrickle.ops import alerts

QUARANTINE_MAX_ROWS = 1_000_000
"""At most this many held-back changes per stream table are copied for inspection."""


@dataclass(frozen=True)
class GateResult:
    blocked: bool
    reason: str


def _config(conn: psycopg.Connection, pgt_id: int) -> tuple[BreakerConfig, str, str | None]:
    row = conn.execute(
        """
        SELECT pgtrickle._cb_mode(cb_mode), cb_ceiling, cb_max_ratio, cb_sensitivity, cb_window, cb_baseline,
               coalesce((SELECT value::bigint FROM pgtrickle.pgt_settings
                          WHERE name = 'circuit_breaker_cold_start_ceiling'), 100000),
               cb_state, cb_trip_reason
          FROM pgtrickle.pgt_stream_tables WHERE pgt_id = %s
        """,
        (pgt_id,),
    ).fetchone()
    assert row is not None
    mode, ceiling, ratio, sensitivity, window, baseline, cold, state, reason = row
    return (
        BreakerConfig(mode, ceiling, ratio, float(sensitivity), int(window), baseline, int(cold)),
        state,
        reason,
    )


def _history(conn: psycopg.Connection, pgt_id: int, window: int) -> list[tuple[int, int]]:
    """(changes, deletions) of past applied refreshes, oldest first (a few windows for EWMA)."""
    rows = conn.execute(
        """
        SELECT delta_row_count, coalesce(delta_deletes, 0) FROM pgtrickle.pgt_refresh_history
         WHERE pgt_id = %s AND status = 'COMPLETED' AND action IN ('FULL', 'DIFFERENTIAL')
           AND initiated_by <> 'INITIAL' AND delta_row_count IS NOT NULL
         ORDER BY refresh_id DESC LIMIT %s
        """,
        (pgt_id, window * 5),
    ).fetchall()
    return [(int(t), int(d)) for t, d in reversed(rows)]


def volume_of(conn: psycopg.Connection, st: StreamTable, pending: Sequence[PendingChanges]) -> Volume:
    truncated = tuple(
        f"{p.source.schema}.{p.source.name}" for p in pending if p.truncated and p.source.kind == "TABLE"
    )
    source_rows = 0.0
    for source in st.sources:
        row = conn.execute("SELECT reltuples FROM pg_class WHERE oid = %s", (source.relid,)).fetchone()
        estimate = float(row[0]) if row else -1.0
        if estimate < 0:  # never analyzed: count (such tables are new, hence small)
            counted = conn.execute(
                sql.SQL("SELECT count(*) FROM {}.{}").format(
                    sql.Identifier(source.schema), sql.Identifier(source.name)
                )
            ).fetchone()
            estimate = float(counted[0]) if counted else 0.0
        source_rows += estimate
    return Volume(
        total=sum(p.rows for p in pending),
        deletes=sum(p.deletes for p in pending),
        truncated=truncated,
        source_rows=source_rows,
    )


def check(
    conn: psycopg.Connection,
    st: StreamTable,
    pending: Sequence[PendingChanges],
    frontier: str,
    upto: str,
    initiated_by: str,
) -> GateResult:
    """Run the breaker for one refresh window; trips and records it when anomalous.

    Call inside the planning transaction. Returns ``blocked`` when the refresh
    must not run (the breaker is, or has just become, open).
    """
    config, state, trip_reason = _config(conn, st.pgt_id)
    if config.mode == "none":
        return GateResult(False, "")
    volume = volume_of(conn, st, pending)
    if state == "open":
        _record_skip(conn, st, initiated_by, volume, f"circuit breaker open: {trip_reason}")
        return GateResult(True, f"circuit breaker open: {trip_reason}")
    decision = should_trip(config, volume, _history(conn, st.pgt_id, config.window))
    _store_baseline(conn, st.pgt_id, decision)
    if not decision.trip:
        return GateResult(False, decision.reason)
    _trip(conn, st, config, volume, decision, frontier, upto, initiated_by)
    return GateResult(True, f"circuit breaker tripped: {decision.reason}")


def _store_baseline(conn: psycopg.Connection, pgt_id: int, decision: TripDecision) -> None:
    base = decision.baseline
    conn.execute(
        "UPDATE pgtrickle.pgt_stream_tables SET cb_baseline_mean = %s, cb_baseline_stddev = %s,"
        " cb_threshold = %s WHERE pgt_id = %s",
        (base.mean if base else None, base.stddev if base else None, decision.threshold, pgt_id),
    )


def _record_skip(
    conn: psycopg.Connection, st: StreamTable, initiated_by: str, volume: Volume, reason: str
) -> None:
    record_skip(conn, st, initiated_by, reason, volume.total, volume.deletes)


def _trip(
    conn: psycopg.Connection,
    st: StreamTable,
    config: BreakerConfig,
    volume: Volume,
    decision: TripDecision,
    frontier: str,
    upto: str,
    initiated_by: str,
) -> None:
    conn.execute(
        """
        UPDATE pgtrickle.pgt_stream_tables
           SET cb_state = 'open', cb_tripped_at = now(), cb_trip_reason = %s, cb_last_delta = %s,
               cb_last_deletes = %s
         WHERE pgt_id = %s
        """,
        (decision.reason, volume.total, volume.deletes, st.pgt_id),
    )
    _record_skip(conn, st, initiated_by, volume, f"circuit breaker tripped: {decision.reason}")
    conn.execute("DELETE FROM pgtrickle.pgt_quarantine WHERE pgt_id = %s", (st.pgt_id,))
    budget = QUARANTINE_MAX_ROWS
    for source in st.sources:
        if budget <= 0:
            break
        cur = conn.execute(
            sql.SQL(
                "INSERT INTO pgtrickle.pgt_quarantine (pgt_id, source, change_id, xid, action, captured_at, change)"
                " SELECT %(id)s, %(src)s, b.change_id, b.xid, b.action, b.captured_at,"
                " to_jsonb(b) - 'change_id' - 'xid' - 'action' - 'captured_at'"
                " FROM pgtrickle_changes.{} b"
                " WHERE b.xid >= pg_snapshot_xmin(%(f)s::pg_snapshot)"
                " AND NOT pg_visible_in_snapshot(b.xid, %(f)s::pg_snapshot)"
                " AND pg_visible_in_snapshot(b.xid, %(u)s::pg_snapshot)"
                " ORDER BY b.change_id LIMIT %(lim)s"
            ).format(sql.Identifier(source.buffer_name)),
            {
                "id": st.pgt_id,
                "src": f"{source.schema}.{source.name}",
                "f": frontier,
                "u": upto,
                "lim": budget,
            },
        )
        budget -= cur.rowcount or 0
    base = decision.baseline
    fields = {
        "mode": config.mode,
        "delta_row_count": volume.total,
        "delete_count": volume.deletes,
        "baseline_mean": round(base.mean, 3) if base else None,
        "baseline_stddev": round(base.stddev, 3) if base else None,
        "ceiling": config.ceiling,
        "computed_threshold": decision.threshold,
        "trip_reason": decision.reason,
    }
    alerts.send_alert(conn, "circuit_breaker_tripped", fields, schema=st.schema, st_name=st.name)
