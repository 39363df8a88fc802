"""``pgtrickle status`` at terminal widths, and the ``--json`` documents, without a database."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

import pytest
from rich.cells import cell_len

from pgtrickle.catalog.store import StreamTable
from pgtrickle.cli.json_output import dumps, explain_document, refresh_document, status_document
from pgtrickle.cli.render import ERROR_CHARS, Col, natural_width, pick_columns, render_text, status_view
from pgtrickle.cli.status_data import AlertRow, CaptureRow, StatusSnapshot, StreamTableRow
from pgtrickle.refresh.capture_check import BrokenCapture
from pgtrickle.refresh.engine import RefreshOutcome
from pgtrickle.refresh.plan import Action
from pgtrickle.daemon.manual import ManualRefresh, Result

NOW = datetime(2026, 11, 26, 16, 0, tzinfo=timezone.utc)
LONG_ERROR = (
    "refresh of public.bad failed: [CAST_INVALID_INPUT] The value 'x' of the type \"STRING\" "
    'cannot be cast to "INT" because it is malformed. Correct the value as per the syntax, or '
    "change the target type. SQLSTATE: 22P02 "
) * 4
# 63 bytes at most in PostgreSQL; markup, an escape sequence, a newline, wide characters.
HOSTILE = 'public."[red]x[/] \x1b[2J名前\nzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"'
LONG_NAME = "analytics.customer_lifetime_value_by_region_and_quarter_rollup_v2"


def st_row(
    name: str,
    status: str = "ACTIVE",
    mode: str = "DIFFERENTIAL",
    *,
    error: str | None = None,
    errors: int = 0,
    stale: int | None = 12,
    broken: tuple[str, ...] = (),
) -> StreamTableRow:
    schema, _, table = name.partition(".")
    return StreamTableRow(
        name=name,
        schema=schema,
        table=table,
        status=status,
        refresh_mode="AUTO",
        effective_mode=mode,
        schedule="*/5 * * * *",
        last_refresh_at=NOW - timedelta(seconds=stale or 0),
        staleness=None if stale is None else timedelta(seconds=stale),
        pending_requests=1,
        consecutive_errors=errors,
        last_error=error,
        broken_sources=broken,
    )


ROWS = (
    st_row("public.order_summary"),
    st_row("public.bad", "ERROR", "FULL", error=LONG_ERROR, errors=3, stale=7500),
    st_row(HOSTILE, "SUSPENDED", error="boom [bold]x[/] \x1b[31m", errors=5),
    st_row(LONG_NAME, "INITIALIZING", stale=None, broken=("public.t",)),
)
EXPECTED = {  # name: (status, mode, staleness, error shown)
    "public.order_summary": ("ACTIVE", "DIFFERENTIAL", "12s", None),
    "public.bad": ("ERROR", "FULL", "2h05m", "refresh of public.bad failed: [CAST_INVALID_INPUT] The value"),
    HOSTILE: ("SUSPENDED", "DIFFERENTIAL", "12s", r"boom [bold]x[/] \x1b[31m"),
    LONG_NAME: ("INITIALIZING", "DIFFERENTIAL", "-", "change capture broken: public.t"),
}

SNAPSHOT = StatusSnapshot(
    database="postgresql://app:****@db.example.com:5432/shop",
    at=NOW,
    stream_tables=ROWS,
    capture=(
        CaptureRow("public.orders", "trigger", "auto", None, None, 12, timedelta(seconds=5)),
        CaptureRow("public.t", "wal", "wal", False, 123456, None, None, ("capture trigger missing",)),
    ),
    broken=(BrokenCapture(1, "public.t", ("capture trigger missing",)),),
    groups=(("diamond", ("public.a", "public.b")),),
    alerts=(AlertRow(NOW, "circuit_breaker_tripped", "public.bad", {"ratio": 3.5}),),
)

BORDERS = "│┃"


def _visible(text: str) -> str:
    """What the name looks like on screen: control characters shown as escapes."""
    return re.sub(r"[\x00-\x1f]", lambda m: repr(m.group())[1:-1], text)


def _squash(text: str) -> str:
    return "".join(text.split())


def st_table_columns(output: str) -> dict[str, list[str]]:
    """The stream-table table's cells, column by column (folded lines joined), by header."""
    lines = output.splitlines()
    head = next(i for i, line in enumerate(lines) if "┃ stream table" in line)
    headers = [h.strip() for h in lines[head].strip("┃").split("┃")]
    columns: dict[str, list[str]] = {h: [] for h in headers}
    for line in lines[head + 2 :]:
        if line.startswith("└"):
            break
        cells = line.strip("│").split("│")
        assert len(cells) == len(headers), line
        starts_row = cells[headers.index("status")].strip() != "" and not cells[
            headers.index("status")
        ].strip().startswith("capture")
        for header, cell in zip(headers, cells, strict=True):
            if starts_row:
                columns[header].append(cell.strip())
            else:
                columns[header][-1] += cell.strip()
    return columns


@pytest.mark.parametrize("width", [60, 80, 120, 200])
def test_every_stream_table_is_readable_at_any_width(width: int) -> None:
    out = render_text(status_view(SNAPSHOT, width), width)
    assert all(cell_len(line) <= width for line in out.splitlines()), out
    assert "\x1b" not in out, "control characters are shown escaped, never sent to the terminal"
    cols = st_table_columns(out)
    names = [_squash(n) for n in cols["stream table"]]
    assert names == [_squash(_visible(n)) for n in EXPECTED], out
    for (status, mode, staleness, _), got_status, got_mode, got_stale in zip(
        EXPECTED.values(), cols["status"], cols["mode"], cols["staleness"], strict=True
    ):
        assert got_status.startswith(status) and got_mode == mode and got_stale == staleness, out
    squashed = _squash(out)
    for name, (*_, error) in EXPECTED.items():
        if error is None:
            continue
        if "last error" in cols:
            shown = next(
                e
                for n, e in zip(cols["stream table"], cols["last error"], strict=True)
                if _squash(n) == _squash(_visible(name))
            )
            assert _squash(shown).startswith(_squash(error)), out
        else:
            assert _squash(f"✗{_visible(name)}") in squashed and _squash(error) in squashed, out


def test_narrow_terminals_list_errors_under_the_table_and_wide_ones_in_it() -> None:
    at_80 = render_text(status_view(SNAPSHOT, 80), 80)
    assert "last errors:" in at_80 and "(3 consecutive errors)" in at_80
    at_200 = render_text(status_view(SNAPSHOT, 200), 200)
    assert "last errors:" not in at_200 and "┃ last error" in at_200
    for column in ("schedule", "last refresh", "queued", "errors"):
        assert f"┃ {column}" in at_200
    assert "*/5 * * * *" in at_200


def test_a_long_error_is_shown_up_to_its_limit() -> None:
    out = render_text(status_view(SNAPSHOT, 120), 120)
    error = " ".join(st_table_columns(out)["last error"][1].split())
    assert error.endswith("…") and len(_squash(error)) <= ERROR_CHARS
    assert _squash(LONG_ERROR).startswith(_squash(error)[:-1])


def test_wide_shows_every_column() -> None:
    out = render_text(status_view(SNAPSHOT, 60, wide=True), 400)
    header = next(line for line in out.splitlines() if "┃ stream table" in line)
    assert [h.strip() for h in header.strip("┃").split("┃")] == [
        "stream table",
        "status",
        "mode",
        "schedule",
        "last refresh",
        "staleness",
        "queued",
        "watermark gating",
        "errors",
        "last error",
    ]
    assert "slot lag" in out and "setting" in out
    view = status_view(SNAPSHOT, 60, wide=True)
    width = natural_width(view)
    unfolded = render_text(view, width)
    assert all(cell_len(line) <= width for line in unfolded.splitlines())
    assert _visible(HOSTILE) in unfolded and LONG_NAME in unfolded, "nothing folds at the natural width"


def test_markup_in_names_and_errors_is_shown_as_typed() -> None:
    out = render_text(status_view(SNAPSHOT, 200), 200)
    assert "[red]x[/]" in out and "boom [bold]x[/]" in out and r"\x1b[2J" in out and r"\n" in out


def test_no_stream_tables() -> None:
    out = render_text(status_view(StatusSnapshot(database="db", at=NOW), 80), 80)
    assert "no stream tables yet" in out


def test_pick_columns_keeps_required_and_adds_by_priority() -> None:
    cols = [
        Col("a", "a", 0, fold=True, min_width=5, readable=10),
        Col("b", "b", 2),
        Col("c", "c", 1),
        Col("d", "d", 0),
    ]
    natural = {"a": 40, "b": 10, "c": 10, "d": 3}
    assert [c.key for c in pick_columns(cols, natural, 20)] == ["a", "d"]
    assert [c.key for c in pick_columns(cols, natural, 36)] == ["a", "c", "d"]
    assert [c.key for c in pick_columns(cols, natural, 60)] == ["a", "b", "c", "d"]
    assert [c.key for c in pick_columns(cols, natural, 1, wide=True)] == ["a", "b", "c", "d"]


# ------------------------------------------------------------------ --json

ST_FIELDS = {
    "name": str,
    "schema": str,
    "table": str,
    "status": str,
    "refresh_mode": str,
    "effective_mode": str,
    "schedule": str,
    "last_refresh_at": (str, type(None)),
    "staleness_seconds": (float, type(None)),
    "pending_requests": int,
    "consecutive_errors": int,
    "last_error": (str, type(None)),
    "capture_broken": bool,
    "broken_sources": list,
    "watermark": dict,
}


def test_status_json_fields() -> None:
    doc = json.loads(dumps(status_document(SNAPSHOT)))
    assert set(doc) == {
        "schema_version",
        "database",
        "at",
        "capture_intact",
        "stream_tables",
        "change_capture",
        "broken_capture",
        "refresh_groups",
        "recent_alerts",
    }
    assert doc["schema_version"] == 1 and doc["capture_intact"] is False
    assert doc["at"] == "2026-11-26T16:00:00+00:00"
    for st in doc["stream_tables"]:
        assert set(st) == set(ST_FIELDS)
        for field, kind in ST_FIELDS.items():
            assert isinstance(st[field], kind), (field, st[field])
        assert set(st["watermark"]) == {
            "gating",
            "gating_origin",
            "gate_closed",
            "gate_reason",
            "effective_watermark",
        }
    by_name = {st["name"]: st for st in doc["stream_tables"]}
    assert by_name[HOSTILE]["last_error"] == "boom [bold]x[/] \x1b[31m"  # whole, exact
    assert by_name["public.bad"]["last_error"] == LONG_ERROR
    assert by_name["public.bad"]["staleness_seconds"] == 7500.0
    assert by_name[LONG_NAME]["staleness_seconds"] is None and by_name[LONG_NAME]["capture_broken"] is True
    assert doc["change_capture"][1] == {
        "source": "public.t",
        "cdc_mode": "wal",
        "cdc_mode_setting": "wal",
        "decoder_attached": False,
        "slot_lag_bytes": 123456,
        "pending_rows": None,
        "oldest_pending_seconds": None,
        "problems": ["capture trigger missing"],
    }
    assert doc["broken_capture"] == [{"source": "public.t", "problems": ["capture trigger missing"]}]
    assert doc["refresh_groups"] == [{"name": "diamond", "members": ["public.a", "public.b"]}]
    assert doc["recent_alerts"] == [
        {
            "at": "2026-11-26T16:00:00+00:00",
            "event": "circuit_breaker_tripped",
            "about": "public.bad",
            "details": {"ratio": 3.5},
        }
    ]
    assert dumps(status_document(SNAPSHOT)).isascii()


def test_explain_json_fields() -> None:
    doc = json.loads(dumps(explain_document("public.t", "AUTO", "DIFFERENTIAL", "GROUP BY: rule")))
    assert doc == {
        "schema_version": 1,
        "name": "public.t",
        "refresh_mode": "AUTO",
        "effective_mode": "DIFFERENTIAL",
        "reason": "GROUP BY: rule",
        "recorded": True,
    }
    assert explain_document("public.t", "DIFFERENTIAL", "ERROR", "DISTINCT ON")["recorded"] is False


def _st(name: str) -> StreamTable:
    return StreamTable(
        pgt_id=1,
        relid=1,
        schema="public",
        name=name,
        defining_query="",
        normalized_query="",
        schedule="1m",
        refresh_mode="AUTO",
        status="ACTIVE",
        needs_reinit=False,
        frontier=None,
        last_refresh_at=None,
        last_attempt_at=None,
        consecutive_errors=0,
        created_at=NOW,
        last_error=None,
        columns=(),
    )


class _SqlError(Exception):
    sqlstate = "22P02"


def test_refresh_json_has_each_outcome_and_the_summary() -> None:
    good = _st("good")
    boom = "refresh of public.bad failed: boom"
    results = [
        ManualRefresh(
            good,
            Result.REFRESHED,
            "3 changes",
            RefreshOutcome(
                good, Action.DIFFERENTIAL, "3 changes", rows_inserted=2, rows_deleted=1, seconds=0.25
            ),
        ),
        ManualRefresh(_st("bad"), Result.FAILED, boom, error=_SqlError("boom")),
        ManualRefresh(_st("bad_down"), Result.SKIPPED, "upstream public.bad failed in this run"),
    ]
    doc = json.loads(dumps(refresh_document(results)))
    assert doc["summary"] == {"total": 3, "refreshed": 1, "failed": 1, "skipped": 1, "exit_code": 1}
    assert doc["stream_tables"] == [
        {
            "name": "public.good",
            "result": "REFRESHED",
            "action": "DIFFERENTIAL",
            "reason": "3 changes",
            "rows_inserted": 2,
            "rows_deleted": 1,
            "seconds": 0.25,
            "spark_jobs": 0,
            "error": None,
        },
        {
            "name": "public.bad",
            "result": "FAILED",
            "action": None,
            "reason": boom,
            "rows_inserted": None,
            "rows_deleted": None,
            "seconds": None,
            "spark_jobs": None,
            "error": {"type": "_SqlError", "sqlstate": "22P02", "message": boom},
        },
        {
            "name": "public.bad_down",
            "result": "SKIPPED",
            "action": None,
            "reason": "upstream public.bad failed in this run",
            "rows_inserted": None,
            "rows_deleted": None,
            "seconds": None,
            "spark_jobs": None,
            "error": None,
        },
    ]
    assert refresh_document([])["summary"] == {
        "total": 0,
        "refreshed": 0,
        "failed": 0,
        "skipped": 0,
        "exit_code": 0,
    }


class _SparkError(Exception):
    def getSqlState(self) -> str:  # noqa: N802 (pyspark's name)
        return "22P02"


def test_refresh_json_error_sqlstate_comes_from_the_cause() -> None:
    try:
        try:
            raise _SparkError("[CAST_INVALID_INPUT]")
        except _SparkError as exc:
            raise RuntimeError("refresh of public.bad failed") from exc
    except RuntimeError as wrapped:
        error = wrapped
    doc = refresh_document([ManualRefresh(_st("bad"), Result.FAILED, "refresh failed", error=error)])
    assert doc["stream_tables"][0]["error"] == {
        "type": "RuntimeError",
        "sqlstate": "22P02",
        "message": "refresh failed",
    }
