"""The refresh history rows of a refresh, and the failure it records (error count, status, alerts).

Used by the engine and by atomic groups; every function works on the catalog
connection it is given.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import psycopg

from pgtrickle.catalog.store import StreamTable
from pgtrickle.ops import alerts, health
from pgtrickle.refresh.plan import RefreshPlan
from pgtrickle.scheduler.policy import STOPPED_STATUSES
from pgtrickle.spark import jobs

log = logging.getLogger(__name__)


def wal_capture_set_up(conn: psycopg.Connection) -> bool:
    """Whether the WAL decoder is set up in this database (a refresh then waits for it)."""
    row = conn.execute("SELECT EXISTS (SELECT 1 FROM pgtrickle.pgt_decoder_state)").fetchone()
    return bool(row and row[0])


def start_history(conn: psycopg.Connection, st: StreamTable, plan: RefreshPlan, initiated_by: str) -> int:
    """A RUNNING history row for a refresh of ``st`` about to run ``plan``; its refresh_id.

    Its Spark job count is NULL until the refresh completes or fails (then counted).
    """
    row = conn.execute(
        """
        INSERT INTO pgtrickle.pgt_refresh_history
            (pgt_id, action, status, initiated_by, delta_row_count, delta_deletes, mode_reason,
             was_full_fallback, spark_jobs, spark_stages)
        VALUES (%s, %s, 'RUNNING', %s, %s, %s, %s, %s, NULL, NULL) RETURNING refresh_id
        """,
        (
            st.pgt_id,
            plan.action.value,
            initiated_by,
            plan.delta_rows,
            plan.delta_deletes,
            plan.reason,
            plan.was_full_fallback,
        ),
    ).fetchone()
    assert row is not None
    return int(row[0])


def set_batch(conn: psycopg.Connection, history_ids: Sequence[int]) -> None:
    """Mark the history rows of a batch's members (refresh/batch.py): ``batch_id`` is the first one's id."""
    conn.execute(
        "UPDATE pgtrickle.pgt_refresh_history SET batch_id = %s WHERE refresh_id = ANY(%s)",
        (history_ids[0], list(history_ids)),
    )


def batch_jobs_why(lead: int, members: int, shared: jobs.JobFigures, failed: bool = False) -> str:
    """``spark_jobs_why`` of a batch's first member: its jobs are the batch's shared ones."""
    why = f"the shared Spark job of batch {lead} ({members} stream tables)"
    if failed:
        why += " failed; its members were refreshed one by one"
    return why + (f"; {shared.why}" if shared.why else "")


def record_batch_jobs(
    conn: psycopg.Connection, lead: int, members: int, shared: jobs.JobFigures, failed: bool
) -> None:
    """Add a batch's shared Spark job(s) to the history row of its first member (``lead``), when
    that member did not record them with its own apply (it refreshed on its own instead)."""
    why = batch_jobs_why(lead, members, shared, failed)
    conn.execute(
        """
        UPDATE pgtrickle.pgt_refresh_history
           SET spark_jobs = CASE WHEN %(j)s::int IS NULL THEN NULL ELSE coalesce(spark_jobs, 0) + %(j)s END,
               spark_stages = CASE WHEN %(s)s::int IS NULL THEN NULL ELSE coalesce(spark_stages, 0) + %(s)s END,
               spark_jobs_why = concat_ws('; ', %(w)s::text, spark_jobs_why)
         WHERE refresh_id = %(id)s
        """,
        {"j": shared.jobs, "s": shared.stages, "w": why, "id": lead},
    )


def record_failure(
    conn: psycopg.Connection, st: StreamTable, history_id: int, message: str, *, fatal: bool
) -> None:
    """Record a failed refresh: history row, error count, status (auto-suspension / ERROR), alerts.

    One transaction, so the status and its alerts never disagree. The
    decision is :func:`pgtrickle.ops.health.after_failure`. The Spark jobs that ran before
    the failure are counted (none when it failed before reaching Spark).
    """
    ran = jobs.figures()
    try:
        with conn.transaction():
            hist = conn.execute(
                "UPDATE pgtrickle.pgt_refresh_history SET status = 'FAILED', end_time = clock_timestamp(),"
                " error_message = %s, spark_jobs = %s, spark_stages = %s, spark_jobs_why = %s"
                " WHERE refresh_id = %s RETURNING action, initiated_by",
                (message, ran.jobs, ran.stages, ran.why, history_id),
            ).fetchone()
            row = conn.execute(
                "SELECT status, consecutive_errors + 1 FROM pgtrickle.pgt_stream_tables"
                " WHERE pgt_id = %s FOR UPDATE",
                (st.pgt_id,),
            ).fetchone()
            if row is None:
                return  # dropped meanwhile
            status, errors = str(row[0]), int(row[1])
            threshold = int(alerts.setting(conn, "auto_suspend_after", health.DEFAULT_AUTO_SUSPEND_AFTER))
            verdict = health.after_failure(status, errors, threshold, fatal)
            conn.execute(
                """
                UPDATE pgtrickle.pgt_stream_tables
                   SET consecutive_errors = %s, last_error = %s, last_attempt_at = now(), status = %s
                 WHERE pgt_id = %s
                """,
                (errors, message, verdict.status, st.pgt_id),
            )
            for event in verdict.events:
                if event == "refresh_failed":
                    fields: dict[str, object] = {
                        "error": message,
                        "consecutive_errors": errors,
                        "fatal": fatal,
                        "status": verdict.status,
                        "refresh_id": history_id,
                        "action": hist[0] if hist else None,
                        "initiated_by": hist[1] if hist else None,
                    }
                else:  # auto_suspended
                    fields = {
                        "consecutive_errors": errors,
                        "threshold": threshold,
                        "last_error": message,
                        "previous_status": status,
                    }
                alerts.send_alert(conn, event, fields, schema=st.schema, st_name=st.name)
            if verdict.status in STOPPED_STATUSES:
                # Stopped: nothing queued may retry it (a queued initialization would run every tick);
                # the owner's next refresh_stream_table, or resume_stream_table, queues a new request.
                conn.execute("DELETE FROM pgtrickle.pgt_refresh_requests WHERE pgt_id = %s", (st.pgt_id,))
            if verdict.status == "SUSPENDED" and status != "SUSPENDED":
                log.warning(
                    "%s: suspended after %d consecutive failed refreshes; "
                    "resume with pgtrickle.resume_stream_table",
                    st.display,
                    errors,
                )
    except psycopg.Error as exc:
        if conn.broken or conn.closed:  # PostgreSQL went away: the daemon reconnects
            log.warning(
                "could not record the failure of %s: the connection to PostgreSQL is lost (%s)",
                st.display,
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
            )
        else:
            log.exception("could not record the failure of %s", st.display)


def record_abandoned(conn: psycopg.Connection, history_id: int) -> None:
    """A refresh cancelled on request: not the stream table's failure (no error count)."""
    try:
        conn.execute(
            "UPDATE pgtrickle.pgt_refresh_history SET status = 'ABANDONED', end_time = clock_timestamp(),"
            " error_message = 'abandoned on request (second stop signal)' WHERE refresh_id = %s",
            (history_id,),
        )
    except psycopg.Error:
        log.exception("could not record an abandoned refresh")
