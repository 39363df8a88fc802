"""The start and end of every apply transaction (FULL and DIFFERENTIAL alike).

Both run inside the caller's transaction: :func:`lock_for_apply` first (it
refuses when another process refreshed meanwhile), the data changes, then
:func:`complete` — so contents, frontier, history row and consumed requests
commit together (docs/ARCHITECTURE.md, invariant 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import psycopg
from psycopg.types.json import Jsonb

from pgtrickle import faults
from pgtrickle.catalog import identity
from pgtrickle.catalog.store import StreamTable
from pgtrickle.errors import RefreshError
from pgtrickle.spark import jobs

# The reinitialization request is met by this refresh (see :func:`complete`).
_REINIT_DONE = "(%(full)s AND (reinit_xid IS NULL OR pg_visible_in_snapshot(reinit_xid, %(s)s::pg_snapshot)))"


def lock_for_apply(conn: psycopg.Connection, st: StreamTable) -> None:
    """Lock the catalog row; fail if the frontier moved since this refresh started."""
    conn.execute("SET LOCAL lock_timeout = '60s'")
    conn.execute("SET LOCAL TimeZone = 'UTC'")
    current = conn.execute(
        "SELECT frontier::text FROM pgtrickle.pgt_stream_tables WHERE pgt_id = %s FOR UPDATE",
        (st.pgt_id,),
    ).fetchone()
    if current is None:
        raise RefreshError(f"stream table {st.display} was dropped during its refresh")
    if current[0] != st.frontier:
        raise RefreshError(
            f"stream table {st.display} was refreshed by another process meanwhile; this refresh is discarded"
        )
    identity.pin(conn, [identity.stream_table_pin(st)], identity.WRITE)


def complete(
    conn: psycopg.Connection,
    st: StreamTable,
    *,
    snapshot: str,
    lsn: str,
    history_id: int,
    inserted: int,
    deleted: int,
    spark_seconds: float,
    request_ids: Sequence[int],
    recomputed: bool,
    data_timestamp: datetime | None = None,
) -> None:
    """Advance the frontier, mark the table healthy, complete the history row, consume requests.

    A reinitialization request is cleared only by a refresh that ``recomputed`` the
    table in full at a snapshot seeing the requesting transaction (``reinit_xid``;
    requests without one, by any full recompute): a request committed while this
    refresh ran - a partition attached with rows, say - survives it.

    The refresh's watermark state (``st.watermark_mark``: the effective
    watermark, and where a hold_back refresh read each grouped source) is
    stored with the frontier. The Spark jobs the refresh ran (all of them ran before its
    apply) are counted from this thread's job group (:mod:`pgtrickle.spark.jobs`).
    ``data_timestamp`` is the time the data reflects when it is not
    the apply's (a query that reads the clock reflects its snapshot's time).
    """
    faults.point("refresh.apply")
    mark = st.watermark_mark
    ran = jobs.figures()
    conn.execute(
        """
        UPDATE pgtrickle.pgt_stream_tables
           SET frontier = %(s)s::pg_snapshot, frontier_lsn = %(lsn)s::pg_lsn,
               data_timestamp = coalesce(%(dt)s, now()), last_refresh_at = now(), last_attempt_at = now(),
               needs_reinit = needs_reinit AND NOT {done},
               reinit_reason = CASE WHEN needs_reinit AND NOT {done} THEN reinit_reason END,
               reinit_xid = CASE WHEN needs_reinit AND NOT {done} THEN reinit_xid END,
               consecutive_errors = 0, last_error = NULL,
               status = CASE WHEN status IN ('INITIALIZING', 'ERROR') THEN 'ACTIVE' ELSE status END,
               effective_watermark = CASE WHEN %(wm)s THEN %(ew)s ELSE effective_watermark END,
               watermark_positions = CASE WHEN %(wm)s THEN %(pos)s ELSE watermark_positions END,
               updated_at = now()
         WHERE pgt_id = %(id)s
        """.replace("{done}", _REINIT_DONE),
        {
            "s": snapshot,
            "lsn": lsn,
            "id": st.pgt_id,
            "wm": mark is not None,
            "full": recomputed,
            "dt": data_timestamp,
            "ew": mark.effective_watermark if mark else None,
            "pos": Jsonb(mark.positions) if mark and mark.positions else None,
        },
    )
    conn.execute(
        """
        UPDATE pgtrickle.pgt_refresh_history
           SET status = 'COMPLETED', end_time = clock_timestamp(), rows_inserted = %s,
               rows_deleted = %s, frontier = %s::pg_snapshot, spark_seconds = %s, effective_watermark = %s,
               spark_jobs = %s, spark_stages = %s, spark_jobs_why = %s
         WHERE refresh_id = %s
        """,
        (
            inserted,
            deleted,
            snapshot,
            spark_seconds,
            mark.effective_watermark if mark else None,
            ran.jobs,
            ran.stages,
            ran.why,
            history_id,
        ),
    )
    if request_ids:
        conn.execute(
            "DELETE FROM pgtrickle.pgt_refresh_requests WHERE request_id = ANY(%s)", (list(request_ids),)
        )
