"""``pgtrickle status``, ``verify``, ``explain`` and ``history``: what the stream tables are, hold, get and got."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape

from pgtrickle.catalog.install import require_installed
from pgtrickle.cli import render
from pgtrickle.cli.common import console, dsn_of, fail, run_cleanly
from pgtrickle.cli.json_output import dumps, explain_document, status_document
from pgtrickle.cli.status_data import load_status
from pgtrickle.db.connection import connect
from pgtrickle.db.query import scalar
from pgtrickle.db.redaction import scrub
from pgtrickle.refresh.capture_check import find_broken


def status_view(dsn: str, *, alerts_shown: int = 5, width: int | None = None, wide: bool = False) -> Group:
    """Everything ``pgtrickle status`` shows, read now from the catalog, laid out for ``width`` cells."""
    return render.status_view(load_status(dsn, alerts_shown=alerts_shown), width or console.width, wide=wide)


def status(
    ctx: typer.Context,
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="Keep the view on screen, refreshed live.")
    ] = False,
    interval: Annotated[float, typer.Option(help="Seconds between updates with --watch.", min=0.1)] = 2.0,
    count: Annotated[
        int | None,
        typer.Option(
            help="With --watch: stop after this many updates (default: until Ctrl-C).",
            min=1,
            show_default=False,
        ),
    ] = None,
    wide: Annotated[
        bool,
        typer.Option(
            "--wide", help="Show every column, as wide as it needs (lines may be wider than the terminal)."
        ),
    ] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON document (see docs/CLI.md).")] = False,
) -> None:
    """Show every stream table: status, mode, schedule, freshness, errors; change capture; recent alerts.

    The columns shown fit the terminal's width (the name, status, mode, staleness and last error
    always); --wide shows them all. Exit status 2 when the change capture of a source is broken
    (objects dropped by hand; at the end, with --watch).
    """
    if json_ and watch:
        fail("--json prints one document: give --json or --watch, not both")

    def intact(dsn: str) -> bool:
        with connect(dsn) as conn:
            return not find_broken(conn)

    def go() -> bool:
        dsn = dsn_of(ctx, quiet=json_)
        if json_:
            typer.echo(dumps(status_document(load_status(dsn))))
            return intact(dsn)
        if not watch:
            view = status_view(dsn, wide=wide)
            out = Console(width=max(console.width, render.natural_width(view))) if wide else console
            out.print(view)
            return intact(dsn)
        shown = 1
        with Live(status_view(dsn, wide=wide), console=console, refresh_per_second=4, screen=False) as live:
            try:
                while count is None or shown < count:
                    time.sleep(interval)
                    live.update(status_view(dsn, wide=wide))
                    shown += 1
            except KeyboardInterrupt:
                pass
        return intact(dsn)

    if not run_cleanly(go):
        raise typer.Exit(2)


def verify(
    ctx: typer.Context,
    names: Annotated[
        list[str] | None, typer.Argument(help="Stream tables to check (default: all).", show_default=False)
    ] = None,
) -> None:
    """Compare stream tables with their defining queries run in PostgreSQL (EXCEPT ALL both ways).

    Also fails a stream table whose change capture is broken. Each stream table
    is checked on its own; exit status 1 when any is not ok. Differences can
    also be changes not refreshed yet: run it when sources are quiet.
    """
    from pgtrickle.refresh.verify import check_all

    def go() -> bool:
        dsn = dsn_of(ctx)
        with connect(dsn) as conn:
            require_installed(conn)
            results = check_all(conn, names or None)
        for result in results:
            if result.ok:
                console.print(f"[green]✓[/] {escape(result.name)}", highlight=False)
            else:
                console.print(
                    f"[red]✗[/] {escape(result.name)}: {escape(scrub(result.describe()))}",
                    highlight=False,
                    soft_wrap=True,
                )
        return all(r.ok for r in results)

    if not run_cleanly(go):
        raise typer.Exit(1)


def explain(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Stream table to explain.", show_default=False)],
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON document (see docs/CLI.md).")] = False,
) -> None:
    """Say which refresh mode a stream table gets (FULL or DIFFERENTIAL) and why, and show its operator tree.

    Analyses the defining query now and records the result, so that
    pgtrickle.explain_refresh_mode() in SQL shows it too. The operator tree has
    one line per node: its rule for computing the change and, where the node
    is kept in a hidden state table, why (materialized: ...); then the hidden
    state tables' names.
    """
    from pgtrickle.catalog.store import load_stream_tables
    from pgtrickle.cli.explain_tree import plan_tree, tree_document, tree_lines
    from pgtrickle.dvm.layout import decide_mode
    from pgtrickle.refresh.plan import READS_CLOCK_REASON

    def go() -> None:
        with connect(dsn_of(ctx, quiet=json_)) as conn:
            pgt_id = int(scalar(conn, "SELECT (pgtrickle._find_st(%s)).pgt_id", (name,)))
            st = load_stream_tables(conn, only=pgt_id)[pgt_id]
            analysis = decide_mode(
                st.normalized_query,
                {f"{s.schema}.{s.name}": [c for c, _ in s.column_types] for s in st.sources},
                {f"{s.schema}.{s.name}": dict(s.column_types) for s in st.sources},
                [c.name for c in st.columns],
                keep_state=st.refresh_mode == "DIFFERENTIAL",
            )
            if st.reads_clock and st.refresh_mode != "DIFFERENTIAL":
                mode, reason = "FULL", READS_CLOCK_REASON
            elif st.refresh_mode == "FULL":
                mode, reason = "FULL", "refresh_mode is FULL"
            elif analysis.differential:
                mode, reason = "DIFFERENTIAL", analysis.reason
            else:
                mode = "FULL" if st.refresh_mode == "AUTO" else "ERROR"
                reason = analysis.reason
            if mode != "ERROR":
                conn.execute(
                    "UPDATE pgtrickle.pgt_stream_tables SET mode_effective = %s, mode_reason = %s,"
                    " mode_analyzed_at = now() WHERE pgt_id = %s",
                    (mode, reason, st.pgt_id),
                )
            kept = conn.execute(
                "SELECT position, relid::regclass::text FROM pgtrickle.pgt_state_tables WHERE pgt_id = %s",
                (st.pgt_id,),
            ).fetchall()
            tree = plan_tree(st, dict(kept))
            if json_:
                document = explain_document(st.display, st.refresh_mode, mode, reason)
                document["operator_tree"] = tree_document(tree)
                typer.echo(dumps(document))
                return
            console.print(
                f"{escape(st.display)}: refresh_mode {st.refresh_mode} → [bold]{mode}[/]", highlight=False
            )
            console.print(f"  {escape(reason)}", highlight=False)
            if mode == "ERROR":
                console.print(
                    "  refresh_mode DIFFERENTIAL cannot run this query; use AUTO or FULL.", highlight=False
                )
            console.print("operator tree:", highlight=False)
            for line in tree_lines(tree):
                console.print(f"  {escape(line)}", highlight=False, soft_wrap=True)

    run_cleanly(go)


def history(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Stream table.", show_default=False)],
    limit: Annotated[int, typer.Option("--limit", "-n", help="How many refreshes, newest first.")] = 20,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON document (see docs/CLI.md).")] = False,
) -> None:
    """Show a stream table's recent refreshes: action, status, rows, seconds, Spark jobs and why."""
    from pgtrickle.cli.history import history_document, history_table, load_history

    def go() -> None:
        with connect(dsn_of(ctx, quiet=json_)) as conn:
            display, rows = load_history(conn, name, limit)
        if json_:
            typer.echo(dumps(history_document(display, rows)))
            return
        console.print(f"{escape(display)}: {len(rows)} most recent refreshes", highlight=False)
        console.print(history_table(rows))

    run_cleanly(go)
