"""Recording a refresh a gate held back (circuit breaker, watermark gate)."""

from __future__ import annotations

import psycopg

from pgtrickle.catalog.store import StreamTable


def record_skip(
    conn: psycopg.Connection,
    st: StreamTable,
    initiated_by: str,
    reason: str,
    changes: int | None,
    deletes: int | None,
) -> None:
    """A SKIPPED history row saying why, and the attempt time (the schedule waits an interval)."""
    conn.execute(
        """
        INSERT INTO pgtrickle.pgt_refresh_history
            (pgt_id, action, status, initiated_by, rows_inserted, rows_deleted, delta_row_count,
             delta_deletes, end_time, skip_reason)
        VALUES (%s, 'SKIP', 'SKIPPED', %s, 0, 0, %s, %s, clock_timestamp(), %s)
        """,
        (st.pgt_id, initiated_by, changes, deletes, reason),
    )
    conn.execute(
        "UPDATE pgtrickle.pgt_stream_tables SET last_attempt_at = now() WHERE pgt_id = %s", (st.pgt_id,)
    )
