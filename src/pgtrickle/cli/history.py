"""``pgtrickle history NAME``: a stream table's refresh history (``pgtrickle.get_refresh_history``).

:func:`load_history` is the only I/O; :func:`history_table` and
:func:`history_document` are pure (rows in, table or JSON document out).
Text from the database is shown as plain text, never as rich markup.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from rich.table import Table
from rich.text import Text

from pgtrickle.cli.json_output import SCHEMA_VERSION
from pgtrickle.cli.render import fmt_time, plain

_STATUS_STYLE = {"COMPLETED": "green", "FAILED": "red", "SKIPPED": "yellow", "ABANDONED": "yellow"}


@dataclass(frozen=True)
class HistoryRow:
    """One row of ``pgtrickle.get_refresh_history`` (same names)."""

    refresh_id: int
    action: str
    status: str
    initiated_by: str
    rows_inserted: int | None
    rows_deleted: int | None
    delta_row_count: int | None
    start_time: datetime
    end_time: datetime | None
    duration: timedelta | None
    was_full_fallback: bool
    mode_reason: str | None
    skip_reason: str | None
    error_message: str | None
    spark_jobs: int | None
    spark_stages: int | None
    spark_jobs_why: str | None

    @property
    def why(self) -> str:
        """The error, the skip's reason or the action's reason (whichever applies), and why several jobs ran."""
        text = self.error_message or self.skip_reason or self.mode_reason or ""
        if self.spark_jobs_why:
            text = f"{text}; {self.spark_jobs_why}" if text else self.spark_jobs_why
        return text


def load_history(conn: psycopg.Connection, name: str, limit: int) -> tuple[str, list[HistoryRow]]:
    """(display name, newest rows first) of the stream table ``name``; the SQL API checks name and limit."""
    rows = conn.execute("SELECT * FROM pgtrickle.get_refresh_history(%s, %s)", (name, limit)).fetchall()
    display = conn.execute(
        "SELECT pgtrickle._display_name(pgt_schema, pgt_name) FROM pgtrickle._find_st(%s)", (name,)
    ).fetchone()
    return str(display[0]) if display else name, [HistoryRow(*row) for row in rows]


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def history_table(rows: list[HistoryRow]) -> Table:
    """One line per refresh, newest first; the reason folds, the figures are never cut."""
    table = Table()
    for name in ("id", "started", "action", "status", "by"):
        table.add_column(name, no_wrap=True)
    for name in ("inserted", "deleted", "changes", "seconds", "jobs", "stages"):
        table.add_column(name, no_wrap=True, justify="right")
    table.add_column("why", overflow="fold", min_width=20)
    for r in rows:
        seconds = "-" if r.duration is None else f"{r.duration.total_seconds():.2f}"
        table.add_row(
            str(r.refresh_id),
            fmt_time(r.start_time),
            r.action + (" (fallback)" if r.was_full_fallback else ""),
            Text(r.status, style=_STATUS_STYLE.get(r.status, "")),
            r.initiated_by,
            _count(r.rows_inserted),
            _count(r.rows_deleted),
            _count(r.delta_row_count),
            seconds,
            _count(r.spark_jobs),
            _count(r.spark_stages),
            Text(plain(r.why)),
        )
    return table


def history_document(name: str, rows: list[HistoryRow]) -> dict[str, Any]:
    """``pgtrickle history NAME --json``."""
    return {
        "schema_version": SCHEMA_VERSION,
        "name": name,
        "refreshes": [
            {
                "refresh_id": r.refresh_id,
                "action": r.action,
                "status": r.status,
                "initiated_by": r.initiated_by,
                "rows_inserted": r.rows_inserted,
                "rows_deleted": r.rows_deleted,
                "delta_row_count": r.delta_row_count,
                "start_time": r.start_time.isoformat(),
                "end_time": r.end_time.isoformat() if r.end_time else None,
                "seconds": r.duration.total_seconds() if r.duration is not None else None,
                "was_full_fallback": r.was_full_fallback,
                "mode_reason": r.mode_reason,
                "skip_reason": r.skip_reason,
                "error_message": r.error_message,
                "spark_jobs": r.spark_jobs,
                "spark_stages": r.spark_stages,
                "spark_jobs_why": r.spark_jobs_why,
            }
            for r in rows
        ],
    }
