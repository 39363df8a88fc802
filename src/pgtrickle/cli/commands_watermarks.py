"""``pgtrickle watermarks``: watermark groups and every source's watermark."""

from __future__ import annotations

import typer
from rich.table import Table

from pgtrickle.catalog.install import require_installed
from pgtrickle.cli.common import console, dsn_of, run_cleanly
from pgtrickle.cli.render import fmt_interval
from pgtrickle.db.connection import connect


def watermarks(ctx: typer.Context) -> None:
    """Show watermark groups (aligned or not, lag, effective watermark) and every source's watermark."""
    from pgtrickle.db.instants import tolerant_cursor

    def ts(value) -> str:
        return value.strftime("%Y-%m-%d %H:%M:%S%z") if value is not None else "-"

    def go() -> None:
        with connect(dsn_of(ctx)) as conn:
            require_installed(conn)
            # A watermark outside years 1..9999 left in the catalog is shown, not fatal (db/instants.py).
            groups = (
                tolerant_cursor(conn)
                .execute(
                    "SELECT group_name, state, min_watermark, max_watermark, lag, tolerance, effective_watermark,"
                    " lagging_sources, stuck_sources, stream_tables FROM pgtrickle.watermark_status()"
                )
                .fetchall()
            )
            sources = (
                tolerant_cursor(conn)
                .execute(
                    "SELECT source, watermark, advanced_at, advanced_by, application_name, groups, stuck_in"
                    " FROM pgtrickle.watermarks()"
                )
                .fetchall()
            )
        if not groups and not sources:
            console.print(
                "no watermarks yet: SELECT pgtrickle.advance_watermark(source, watermark) after a load, "
                "and pgtrickle.create_watermark_group(name, sources) to align sources"
            )
            return
        table = Table(
            "group",
            "state",
            "min",
            "max",
            "lag",
            "tolerance",
            "effective",
            "lagging",
            "stuck",
            "stream tables",
            title="watermark groups",
        )
        for name, state, low, high, lag, tolerance, effective, lagging, stuck, sts in groups:
            colour = {"aligned": "green", "misaligned": "yellow", "bootstrapping": "cyan"}[state]
            table.add_row(
                name,
                f"[{colour}]{state}[/]",
                ts(low),
                ts(high),
                fmt_interval(lag),
                fmt_interval(tolerance),
                ts(effective),
                ", ".join(lagging),
                "[red]" + ", ".join(stuck) + "[/]" if stuck else "",
                ", ".join(sts),
            )
        console.print(table)
        table = Table(
            "source", "watermark", "advanced at", "by", "application", "groups", "stuck in", title="sources"
        )
        for source, watermark, at, by, application, in_groups, stuck_in in sources:
            table.add_row(
                source,
                ts(watermark),
                ts(at),
                by,
                application or "",
                ", ".join(in_groups),
                "[red]" + ", ".join(stuck_in) + "[/]" if stuck_in else "",
            )
        console.print(table)

    run_cleanly(go)
