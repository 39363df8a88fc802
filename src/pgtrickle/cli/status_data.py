"""What ``pgtrickle status`` shows, read from the catalog into plain values.

The reading is the only I/O; :mod:`pgtrickle.cli.render` (the terminal view)
and :mod:`pgtrickle.cli.json_output` (``--json``) are pure functions of a
:class:`StatusSnapshot`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pgtrickle.catalog.install import require_installed
from pgtrickle.db.connection import connect, redact
from pgtrickle.db.query import scalar
from pgtrickle.db.redaction import scrub
from pgtrickle.refresh.capture_check import BrokenCapture, broken_by_stream_table, find_broken


@dataclass(frozen=True)
class StreamTableRow:
    """One row of ``pgtrickle.stream_tables_info``, as the status view needs it."""

    name: str
    """The display name (``schema.table``, quoted where needed)."""
    schema: str
    table: str
    status: str
    refresh_mode: str
    effective_mode: str
    schedule: str
    last_refresh_at: datetime | None
    staleness: timedelta | None
    pending_requests: int
    consecutive_errors: int
    last_error: str | None
    """Already scrubbed of passwords."""
    watermark_gating: str = "none"
    watermark_gating_origin: str = "inferred"
    watermark_gate: str | None = None
    """Why the watermark gate is closed now, or None when it is open."""
    effective_watermark: datetime | None = None
    broken_sources: tuple[str, ...] = ()
    """Sources read by this stream table whose change capture is broken."""


@dataclass(frozen=True)
class CaptureRow:
    """One captured source (``pgtrickle.check_cdc_health()``)."""

    source: str
    cdc_mode: str
    cdc_mode_setting: str
    decoder_attached: bool | None
    slot_lag_bytes: int | None
    pending_rows: int | None
    oldest_pending: timedelta | None
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class AlertRow:
    at: datetime
    event: str
    about: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StatusSnapshot:
    """Everything ``pgtrickle status`` shows, read at one moment."""

    database: str
    """The DSN with its password masked."""
    at: datetime
    stream_tables: tuple[StreamTableRow, ...] = ()
    capture: tuple[CaptureRow, ...] = ()
    broken: tuple[BrokenCapture, ...] = ()
    groups: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Atomic refresh groups: (name, member display names)."""
    alerts: tuple[AlertRow, ...] = ()
    """The most recent alerts, newest first."""


def _scrubbed(value: Any) -> Any:
    """``value`` (decoded JSON) with passwords masked in every string."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, list):
        return [_scrubbed(v) for v in value]
    if isinstance(value, dict):
        return {k: _scrubbed(v) for k, v in value.items()}
    return value


def load_status(dsn: str, *, alerts_shown: int = 5) -> StatusSnapshot:
    """Read the status of every stream table, the change capture and recent alerts now."""
    from pgtrickle.catalog.store import load_stream_tables
    from pgtrickle.daemon.loop import effective_groups
    from pgtrickle.db.instants import tolerant_cursor

    with connect(dsn) as conn:
        require_installed(conn)
        rows = (
            tolerant_cursor(conn)
            .execute(
                "SELECT name, schema_name, table_name, status, refresh_mode, effective_mode, schedule,"
                " last_refresh_at, staleness, pending_requests, consecutive_errors, last_error,"
                " watermark_gating, watermark_gating_origin, watermark_gate, effective_watermark, pgt_id"
                " FROM pgtrickle.stream_tables_info ORDER BY name"
            )
            .fetchall()
        )
        broken = find_broken(conn) if rows else []
        broken_sts = broken_by_stream_table(conn) if broken else {}
        health = (
            conn.execute(
                "SELECT source, cdc_mode, cdc_mode_setting, slot_active, lag_bytes, pending_rows,"
                " oldest_pending_age, problems FROM pgtrickle.check_cdc_health()"
            ).fetchall()
            if rows
            else []
        )
        recent = (
            conn.execute(
                "SELECT at, event, coalesce(pgtrickle._display_name(st_schema, st_name), payload->>'slot',"
                " payload->>'source', payload->>'group', ''), payload FROM pgtrickle.alerts"
                " ORDER BY alert_id DESC LIMIT %s",
                (alerts_shown,),
            ).fetchall()
            if alerts_shown > 0
            else []
        )
        now = scalar(conn, "SELECT now()")
        sts = load_stream_tables(conn) if rows else {}
        groups = tuple(
            (g.name, tuple(sts[m].display for m in sorted(g.members))) for g in effective_groups(conn, sts)
        )
    stream_tables = tuple(
        StreamTableRow(
            name=name,
            schema=schema,
            table=table,
            status=st_status,
            refresh_mode=refresh_mode,
            effective_mode=mode,
            schedule=schedule,
            last_refresh_at=last,
            staleness=staleness,
            pending_requests=int(queued),
            consecutive_errors=int(errors or 0),
            last_error=scrub(error) if error else None,
            watermark_gating=gating,
            watermark_gating_origin=origin,
            watermark_gate=gate,
            effective_watermark=effective,
            broken_sources=tuple(b.source for b in broken_sts.get(pgt_id, ())),
        )
        for (
            name,
            schema,
            table,
            st_status,
            refresh_mode,
            mode,
            schedule,
            last,
            staleness,
            queued,
            errors,
            error,
            gating,
            origin,
            gate,
            effective,
            pgt_id,
        ) in rows
    )
    capture = tuple(
        CaptureRow(
            source=source,
            cdc_mode=mode,
            cdc_mode_setting=setting,
            decoder_attached=None if mode == "trigger" else bool(active),
            slot_lag_bytes=None if lag is None else int(lag),
            pending_rows=None if pending is None else int(pending),
            oldest_pending=oldest,
            problems=tuple(problems or ()),
        )
        for source, mode, setting, active, lag, pending, oldest, problems in health
    )
    alerts = tuple(
        AlertRow(
            at=at,
            event=event,
            about=about,
            details={
                k: _scrubbed(v)
                for k, v in (payload or {}).items()
                if k not in ("event", "st_name", "schema", "at", "alert_id")
            },
        )
        for at, event, about, payload in recent
    )
    return StatusSnapshot(
        database=redact(dsn),
        at=now,
        stream_tables=stream_tables,
        capture=capture,
        broken=tuple(broken),
        groups=groups,
        alerts=alerts,
    )
