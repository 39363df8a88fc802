"""Sending alerts and the checks behind them, at the edge (database I/O).

Every alert goes through the SQL function ``pgtrickle._send_alert``: one row
in ``pgtrickle.alerts`` and one NOTIFY on ``pg_trickle_alert``, both in the
caller's transaction (delivered and visible at commit, or not at all). The
decisions are in :mod:`pgtrickle.ops.health`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import datetime

import psycopg

from pgtrickle.ops import health
from pgtrickle.scheduler.schedule import CalculatedSchedule, Schedule, interval_seconds

log = logging.getLogger(__name__)

CHANNEL = "pg_trickle_alert"


def send_alert(
    conn: psycopg.Connection,
    event: str,
    fields: Mapping[str, object] | None = None,
    *,
    schema: str | None = None,
    st_name: str | None = None,
) -> None:
    """Send ``event`` (about stream table ``schema.st_name``, when given) with ``fields``."""
    payload: dict[str, object] = {"event": event}
    if st_name is not None:
        payload["st_name"] = st_name
        payload["schema"] = schema
    payload.update(fields or {})
    conn.execute("SELECT pgtrickle._send_alert(%s::jsonb)", (json.dumps(payload, default=str),))


def setting(conn: psycopg.Connection, name: str, default: float) -> float:
    """A numeric database setting, or ``default`` when missing or not a number."""
    row = conn.execute("SELECT value FROM pgtrickle.pgt_settings WHERE name = %s", (name,)).fetchone()
    try:
        return float(row[0]) if row and row[0] is not None else default
    except ValueError:
        log.warning("setting %s is not a number (%r); using %s", name, row[0] if row else None, default)
        return default


def check_staleness(conn: psycopg.Connection, schedules: Mapping[int, Schedule], now: datetime) -> list[str]:
    """Send ``stale_data`` / ``stale_data_resolved`` where due; returns the events sent.

    ``schedules`` are the effective (resolved) schedules by pgt_id, as the
    daemon computed them this tick. The alert state (``stale_alerted_at``) is
    in the catalog, so a restarted daemon does not alert the same episode again.
    """
    factor = setting(conn, "stale_data_factor", health.DEFAULT_STALE_DATA_FACTOR)
    rows = conn.execute(
        "SELECT pgt_id, pgt_schema, pgt_name, status, data_timestamp, created_at, stale_alerted_at IS NOT NULL,"
        " schedule FROM pgtrickle.pgt_stream_tables ORDER BY pgt_id"
    ).fetchall()
    sent = []
    for pgt_id, schema, name, status, data_ts, created, alerted, schedule_text in rows:
        schedule = schedules.get(pgt_id)
        if schedule is None or isinstance(schedule, CalculatedSchedule):
            continue
        period = interval_seconds(schedule, now)
        verdict = health.staleness_check(
            status=status,
            data_timestamp=data_ts,
            created_at=created,
            period_seconds=period,
            factor=factor,
            alerted=alerted,
            now=now,
        )
        if verdict.event is None:
            continue
        with conn.transaction():
            if verdict.event == "stale_data":
                cur = conn.execute(
                    "UPDATE pgtrickle.pgt_stream_tables SET stale_alerted_at = %s"
                    " WHERE pgt_id = %s AND stale_alerted_at IS NULL",
                    (now, pgt_id),
                )
            else:
                cur = conn.execute(
                    "UPDATE pgtrickle.pgt_stream_tables SET stale_alerted_at = NULL"
                    " WHERE pgt_id = %s AND stale_alerted_at IS NOT NULL",
                    (pgt_id,),
                )
            if not cur.rowcount:
                continue  # another daemon sent it
            send_alert(
                conn,
                verdict.event,
                {
                    "status": status,
                    "data_timestamp": data_ts.isoformat() if data_ts else None,
                    "staleness_seconds": round(verdict.age.total_seconds(), 3) if verdict.age else None,
                    "threshold_seconds": verdict.threshold.total_seconds() if verdict.threshold else None,
                    "schedule": schedule_text,
                },
                schema=schema,
                st_name=name,
            )
            sent.append(verdict.event)
    return sent


def prune(conn: psycopg.Connection) -> tuple[int, int]:
    """Delete refresh history and alerts past their retention; returns (history rows, alert rows)."""
    row = conn.execute("SELECT history_deleted, alerts_deleted FROM pgtrickle._prune()").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])
