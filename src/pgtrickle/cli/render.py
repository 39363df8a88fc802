"""The ``pgtrickle status`` view for a terminal of a given width (pure: values in, renderable out).

Each table lists its columns with a priority. The columns a reader cannot do
without (a stream table's name, status, mode, staleness and last error) are
always shown; the others are added, most useful first, while the table still
fits the width with the name and error columns at a readable width. Long
names and errors fold onto more lines (rich's ``overflow='fold'``), they are
never cut to a few characters. When the last error does not fit as a column
it is printed in full under the table. ``wide`` shows every column, and
:func:`natural_width` says how wide a console must be to show them unsqueezed.

Everything from the database is shown as plain text (never as rich markup),
with control characters made visible, so no name or error can restyle or
move the terminal.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from pgtrickle.cli.status_data import StatusSnapshot, StreamTableRow

ERROR_CHARS = 300
"""At most this many characters of a last error are shown (``--json`` has it whole)."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_STATUS_STYLE = {"ACTIVE": "green", "INITIALIZING": "cyan", "SUSPENDED": "yellow", "ERROR": "red"}


def plain(value: object) -> str:
    """``value`` as one line of text with control characters visible (``\\n``, ``\\x1b``)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(value))


def fmt_interval(value: timedelta | None) -> str:
    if value is None:
        return "-"
    seconds = int(value.total_seconds())
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


def fmt_time(value: datetime | None, default: str = "-") -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else default


def short_error(error: str) -> str:
    """A last error on one line, at most :data:`ERROR_CHARS` characters."""
    text = Text(plain(" ".join(error.split())))
    text.truncate(ERROR_CHARS, overflow="ellipsis")
    return text.plain


# ------------------------------------------------------------ columns


@dataclass(frozen=True)
class Col:
    key: str
    header: str
    priority: int
    """0: always shown; otherwise the lower, the earlier it is added when there is room."""
    fold: bool = False
    """Long values fold onto more lines (the name and error columns); others never wrap."""
    min_width: int = 0
    """For a folding column: the narrowest it may become."""
    readable: int = 0
    """For a folding column: the width it keeps before optional columns are added."""


def _overhead(n: int) -> int:
    """Borders and padding of a boxed table with ``n`` columns."""
    return 3 * n + 1


def pick_columns(
    cols: Sequence[Col], natural: dict[str, int], width: int, *, wide: bool = False
) -> list[Col]:
    """The columns to show in ``width`` cells, in their original order (pure).

    ``natural`` is each column's widest cell (header included). Required
    columns are always kept; an optional one is added, by priority, when the
    table still fits with each folding column at its ``readable`` width.
    """
    if wide:
        return list(cols)

    def need(chosen: Sequence[Col]) -> int:
        return sum(min(natural[c.key], c.readable) if c.fold else natural[c.key] for c in chosen) + _overhead(
            len(chosen)
        )

    chosen = [c for c in cols if c.priority == 0]
    for col in sorted((c for c in cols if c.priority > 0), key=lambda c: c.priority):
        if need([*chosen, col]) <= width:
            chosen.append(col)
    return [c for c in cols if c in chosen]


def fits(cols: Sequence[Col], natural: dict[str, int], width: int) -> bool:
    """Whether ``cols`` fit in ``width`` with each folding column at its readable width."""
    return (
        sum(min(natural[c.key], c.readable) if c.fold else natural[c.key] for c in cols)
        + _overhead(len(cols))
        <= width
    )


def _cell_width(cell: Text) -> int:
    return max((line.cell_len for line in cell.split("\n")), default=0)


def _table(
    cols: Sequence[Col], rows: Sequence[dict[str, Text]], width: int, *, wide: bool, title: str
) -> Table:
    natural = {c.key: max([len(c.header), *(_cell_width(r[c.key]) for r in rows)]) for c in cols}
    shown = pick_columns(cols, natural, width, wide=wide)
    table = Table(title=Text(title), title_justify="left")
    for c in shown:
        if c.fold:
            table.add_column(c.header, min_width=min(natural[c.key], c.min_width), overflow="fold")
        else:
            table.add_column(c.header, no_wrap=True, overflow="fold")
    for r in rows:
        table.add_row(*(r[c.key] for c in shown))
    return table


# ------------------------------------------------------ stream tables

_ST_COLS = (
    Col("name", "stream table", 0, fold=True, min_width=12, readable=24),
    Col("status", "status", 0),
    Col("mode", "mode", 0),
    Col("schedule", "schedule", 1),
    Col("last_refresh", "last refresh", 3),
    Col("staleness", "staleness", 0),
    Col("queued", "queued", 5),
    Col("gating", "watermark gating", 4, fold=True, min_width=10, readable=16),
    Col("errors", "errors", 2),
    Col("error", "last error", 0, fold=True, min_width=16, readable=30),
)


def _error_of(st: StreamTableRow) -> str:
    if st.broken_sources:
        return "change capture broken: " + ", ".join(st.broken_sources)
    return st.last_error or ""


def _gating(st: StreamTableRow) -> Text:
    if st.watermark_gating == "none" and st.watermark_gating_origin == "inferred":
        text = Text("-")
    else:
        text = Text(plain(f"{st.watermark_gating} ({st.watermark_gating_origin})"))
    if st.watermark_gate is not None:
        text.append(" closed", style="yellow")
    if st.effective_watermark is not None:
        text.append(f" @ {fmt_time(st.effective_watermark)}")
    return text


def _st_cells(st: StreamTableRow) -> dict[str, Text]:
    status = Text(plain(st.status), style=_STATUS_STYLE.get(st.status, "white"))
    if st.broken_sources:
        status.append("\ncapture broken", style="red")
    error = _error_of(st)
    return {
        "name": Text(plain(st.name)),
        "status": status,
        "mode": Text(plain(st.effective_mode)),
        "schedule": Text(plain(st.schedule)),
        "last_refresh": Text(fmt_time(st.last_refresh_at, "never")),
        "staleness": Text(fmt_interval(st.staleness)),
        "queued": Text(str(st.pending_requests)),
        "gating": _gating(st),
        "errors": Text(str(st.consecutive_errors) if st.consecutive_errors else ""),
        "error": Text(short_error(error) if error else "", style="red" if st.broken_sources else ""),
    }


def stream_table_view(snapshot: StatusSnapshot, width: int, *, wide: bool = False) -> list[RenderableType]:
    """The stream-table table for ``width`` cells; the last errors under it when they do not fit in it."""
    title = f"stream tables in {plain(snapshot.database)} at {snapshot.at.strftime('%Y-%m-%d %H:%M:%S %Z')}"
    rows = [_st_cells(st) for st in snapshot.stream_tables]
    natural = {c.key: max([len(c.header), *(_cell_width(r[c.key]) for r in rows)]) for c in _ST_COLS}
    errors_inline = wide or fits([c for c in _ST_COLS if c.priority == 0], natural, width)
    cols = _ST_COLS if errors_inline else tuple(c for c in _ST_COLS if c.key != "error")
    parts: list[RenderableType] = [_table(cols, rows, width, wide=wide, title=title)]
    failing = [st for st in snapshot.stream_tables if _error_of(st)]
    if not errors_inline and failing:
        parts.append(Text("last errors:", style="bold"))
        for st in failing:
            line = Text("✗ ", style="red")
            line.append(plain(st.name))
            if st.consecutive_errors:
                line.append(
                    f" ({st.consecutive_errors} consecutive error{'s' if st.consecutive_errors != 1 else ''})"
                )
            line.append(": ")
            line.append(short_error(_error_of(st)))
            line.overflow = "fold"
            parts.append(line)
    return parts


# ------------------------------------------------------ other tables

_CAPTURE_COLS = (
    Col("source", "source", 0, fold=True, min_width=10, readable=20),
    Col("capture", "capture", 0),
    Col("setting", "setting", 5),
    Col("decoder", "decoder", 3),
    Col("lag", "slot lag", 4),
    Col("pending", "pending", 1),
    Col("oldest", "oldest", 2),
    Col("problems", "problems", 0, fold=True, min_width=10, readable=20),
)

_ALERT_COLS = (
    Col("at", "at", 0),
    Col("event", "event", 0, fold=True, min_width=8, readable=16),
    Col("about", "about", 0, fold=True, min_width=8, readable=16),
    Col("details", "details", 1, fold=True, min_width=12, readable=20),
)

_GROUP_COLS = (
    Col("name", "atomic group", 0, fold=True, min_width=8, readable=16),
    Col("members", "members (one snapshot, one transaction)", 0, fold=True, min_width=12, readable=30),
)


def _capture_cells(snapshot: StatusSnapshot) -> list[dict[str, Text]]:
    rows = []
    for c in snapshot.capture:
        rows.append(
            {
                "source": Text(plain(c.source)),
                "capture": Text(plain(c.cdc_mode)),
                "setting": Text(plain(c.cdc_mode_setting)),
                "decoder": Text("-")
                if c.decoder_attached is None
                else (Text("attached") if c.decoder_attached else Text("none", style="red")),
                "lag": Text("-" if c.slot_lag_bytes is None else f"{c.slot_lag_bytes:,} B"),
                "pending": Text("-" if c.pending_rows is None else f"{c.pending_rows:,}"),
                "oldest": Text(fmt_interval(c.oldest_pending)),
                "problems": Text(plain("; ".join(c.problems)), style="red")
                if c.problems
                else Text("ok", style="green"),
            }
        )
    return rows


def _broken_lines(snapshot: StatusSnapshot) -> list[Text]:
    if not snapshot.broken:
        return []
    lines = [
        Text.assemble(
            ("change capture is broken", "bold red"),
            " (changes may be lost; run `pgtrickle install` to repair it, "
            "the stream tables reading it are then recomputed in full):",
        )
    ]
    for b in snapshot.broken:
        lines.append(Text.assemble("  ", ("✗", "red"), " ", plain(f"{b.source}: {'; '.join(b.problems)}")))
    return lines


def status_view(snapshot: StatusSnapshot, width: int, *, wide: bool = False) -> Group:
    """Everything ``pgtrickle status`` shows, laid out for a console ``width`` cells wide."""
    parts = stream_table_view(snapshot, width, wide=wide)
    if not snapshot.stream_tables:
        parts.append(Text("no stream tables yet: SELECT pgtrickle.create_stream_table(name, query)"))
        return Group(*parts)
    parts.append(_table(_CAPTURE_COLS, _capture_cells(snapshot), width, wide=wide, title="change capture"))
    parts.extend(_broken_lines(snapshot))
    if snapshot.groups:
        rows = [
            {"name": Text(plain(name)), "members": Text(plain(", ".join(members)))}
            for name, members in snapshot.groups
        ]
        parts.append(_table(_GROUP_COLS, rows, width, wide=wide, title="refresh groups"))
    if snapshot.alerts:
        rows = [
            {
                "at": Text(fmt_time(a.at)),
                "event": Text(plain(a.event)),
                "about": Text(plain(a.about)),
                "details": Text(short_error(", ".join(f"{k}={v}" for k, v in a.details.items()))),
            }
            for a in snapshot.alerts
        ]
        parts.append(_table(_ALERT_COLS, rows, width, wide=wide, title="recent alerts"))
    return Group(*parts)


def natural_width(renderable: RenderableType) -> int:
    """How many cells ``renderable`` needs to be shown without folding or squeezing anything."""
    console = Console(width=100_000)
    return Measurement.get(console, console.options, renderable).maximum


def render_text(renderable: RenderableType, width: int) -> str:
    """``renderable`` as plain text ``width`` cells wide (what a terminal of that width shows)."""
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()
