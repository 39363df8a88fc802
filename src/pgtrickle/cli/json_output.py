"""The ``--json`` documents of ``pgtrickle status``, ``explain`` and ``refresh`` (pure functions).

The field names are an interface: scripts and monitoring read them, so they
are only ever added to, never renamed. docs/CLI.md documents each one.
Times are ISO 8601 strings with their offset, durations are seconds (numbers),
absent values are ``null``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from pgtrickle.cli.status_data import StatusSnapshot, StreamTableRow

SCHEMA_VERSION = 1
"""Raised only if a field ever has to change meaning (fields are added without raising it)."""


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _seconds(value: timedelta | None) -> float | None:
    return value.total_seconds() if value is not None else None


def _stream_table(st: StreamTableRow) -> dict[str, Any]:
    return {
        "name": st.name,
        "schema": st.schema,
        "table": st.table,
        "status": st.status,
        "refresh_mode": st.refresh_mode,
        "effective_mode": st.effective_mode,
        "schedule": st.schedule,
        "last_refresh_at": _time(st.last_refresh_at),
        "staleness_seconds": _seconds(st.staleness),
        "pending_requests": st.pending_requests,
        "consecutive_errors": st.consecutive_errors,
        "last_error": st.last_error,
        "capture_broken": bool(st.broken_sources),
        "broken_sources": list(st.broken_sources),
        "watermark": {
            "gating": st.watermark_gating,
            "gating_origin": st.watermark_gating_origin,
            "gate_closed": st.watermark_gate is not None,
            "gate_reason": st.watermark_gate,
            "effective_watermark": _time(st.effective_watermark),
        },
    }


def status_document(snapshot: StatusSnapshot) -> dict[str, Any]:
    """``pgtrickle status --json``."""
    return {
        "schema_version": SCHEMA_VERSION,
        "database": snapshot.database,
        "at": _time(snapshot.at),
        "capture_intact": not snapshot.broken,
        "stream_tables": [_stream_table(st) for st in snapshot.stream_tables],
        "change_capture": [
            {
                "source": c.source,
                "cdc_mode": c.cdc_mode,
                "cdc_mode_setting": c.cdc_mode_setting,
                "decoder_attached": c.decoder_attached,
                "slot_lag_bytes": c.slot_lag_bytes,
                "pending_rows": c.pending_rows,
                "oldest_pending_seconds": _seconds(c.oldest_pending),
                "problems": list(c.problems),
            }
            for c in snapshot.capture
        ],
        "broken_capture": [{"source": b.source, "problems": list(b.problems)} for b in snapshot.broken],
        "refresh_groups": [{"name": name, "members": list(members)} for name, members in snapshot.groups],
        "recent_alerts": [
            {"at": _time(a.at), "event": a.event, "about": a.about or None, "details": a.details}
            for a in snapshot.alerts
        ],
    }


def explain_document(name: str, refresh_mode: str, effective_mode: str, reason: str) -> dict[str, Any]:
    """``pgtrickle explain NAME --json``."""
    return {
        "schema_version": SCHEMA_VERSION,
        "name": name,
        "refresh_mode": refresh_mode,
        "effective_mode": effective_mode,
        "reason": reason,
        "recorded": effective_mode != "ERROR",
    }


def refresh_document(results: Sequence) -> dict[str, Any]:
    """``pgtrickle refresh --json``: each stream table's outcome (upstream first) and the summary."""
    from pgtrickle.daemon.manual import results_document

    return served_document(results_document(results))


def served_document(body: dict[str, Any]) -> dict[str, Any]:
    """``pgtrickle refresh --json`` from the document a daemon stored (daemon/manual.py ``results_document``)."""
    return {"schema_version": SCHEMA_VERSION, **body}


def dumps(document: dict[str, Any]) -> str:
    """One JSON document, pretty-printed, ASCII only (safe on any terminal encoding)."""
    return json.dumps(document, indent=2, ensure_ascii=True, default=str)
