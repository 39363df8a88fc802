"""The ``pgtrickle`` command line."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import psycopg
import typer
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from pgtrickle.catalog.install import require_installed
from pgtrickle.cli import render
from pgtrickle.cli.json_output import dumps, explain_document, refresh_document, status_document
from pgtrickle.cli.render import fmt_interval as _fmt_interval
from pgtrickle.cli.reports import capture_repairs, refresh_results
from pgtrickle.cli.status_data import load_status
from pgtrickle.config import Settings
from pgtrickle.db.connection import connect, redact, resolve_dsn
from pgtrickle.db.query import scalar
from pgtrickle.db.redaction import install_log_redaction, register_dsn, scrub
from pgtrickle.errors import PgTrickleError
from pgtrickle.refresh.capture_check import find_broken

app = typer.Typer(
    help="Self-maintaining stream tables for PostgreSQL, computed on Apache Spark.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(
    help="Manage the embedded PostgreSQL server (the default database).", no_args_is_help=True
)
app.add_typer(db_app, name="db")

console = Console()
err_console = Console(stderr=True)


SPARK_REMOTE_HELP = (
    "Run every refresh on this Spark Connect server, e.g. sc://spark-host:15002 "
    "($PGTRICKLE_SPARK_REMOTE); no local Java needed. The server reads PostgreSQL itself."
)


def _settings(ctx: typer.Context) -> Settings:
    return ctx.obj


@app.callback()
def main(
    ctx: typer.Context,
    dsn: Annotated[
        str | None,
        typer.Option(
            help="PostgreSQL DSN (libpq string or URI). Default: $PGTRICKLE_DSN, else the embedded server.",
            show_default=False,
        ),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="Data directory of the embedded server and Spark scratch space ($PGTRICKLE_DATA_DIR).",
            show_default=False,
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            help="TCP port of the embedded server on 127.0.0.1 ($PGTRICKLE_PORT, default 55432).",
            show_default=False,
        ),
    ] = None,
    spark_master: Annotated[
        str | None,
        typer.Option(
            help="Spark master URL ($PGTRICKLE_SPARK_MASTER, default local[*]).", show_default=False
        ),
    ] = None,
    spark_remote: Annotated[str | None, typer.Option(help=SPARK_REMOTE_HELP, show_default=False)] = None,
    jdbc_jar: Annotated[
        str | None,
        typer.Option(
            help="Path of the PostgreSQL JDBC driver jar ($PGTRICKLE_JDBC_JAR).", show_default=False
        ),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log what happens.")] = False,
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    install_log_redaction()
    register_dsn(dsn or os.environ.get("PGTRICKLE_DSN"))
    try:
        ctx.obj = Settings.from_env().with_overrides(
            dsn=dsn,
            data_dir=data_dir,
            embedded_port=port,
            spark_master=spark_master,
            spark_remote=spark_remote,
            jdbc_jar=jdbc_jar,
        )
    except PgTrickleError as exc:
        _fail(str(exc))


def _remote(ctx: typer.Context, spark_remote: str | None) -> Settings:
    """The settings, with a command's own --spark-remote (checked: a bad URL is refused here)."""
    settings = _settings(ctx).with_overrides(spark_remote=spark_remote)
    if settings.spark_remote is not None:
        from pgtrickle.spark.connect import parse_remote

        parse_remote(settings.spark_remote)
    return settings


def _spark_where(settings: Settings) -> str:
    if settings.spark_remote is None:
        return f"Spark master {settings.spark_master}"
    from pgtrickle.spark.connect import parse_remote

    return f"Spark Connect server {parse_remote(settings.spark_remote).shown}"


def _fail(message: str, code: int = 1) -> None:
    err_console.print(f"[bold red]error:[/] {escape(scrub(message))}", highlight=False)
    raise typer.Exit(code)


def _run(fn):
    """Turn pgtrickle and PostgreSQL errors into a clean message and exit code 1."""
    try:
        return fn()
    except PgTrickleError as exc:
        _fail(str(exc))
    except psycopg.Error as exc:
        diag = getattr(exc, "diag", None)
        hint = f"\nhint: {diag.message_hint}" if diag is not None and diag.message_hint else ""
        _fail(f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}{hint}")
    return None


def _dsn(ctx: typer.Context, *, quiet: bool = False) -> str:
    """The database's DSN (starting the embedded server if needed; its spinner on stderr when ``quiet``)."""
    settings = _settings(ctx)
    if settings.dsn is None:
        with (err_console if quiet else console).status("Starting the embedded PostgreSQL server…"):
            return resolve_dsn(settings)
    return resolve_dsn(settings)


# ------------------------------------------------------------------ db


def _embedded(ctx: typer.Context):
    from pgtrickle.db.embedded import EmbeddedPostgres

    settings = _settings(ctx)
    return EmbeddedPostgres(settings.data_dir, settings.embedded_port)


@db_app.command("start")
def db_start(ctx: typer.Context) -> None:
    """Initialise (first time) and start the embedded PostgreSQL server."""
    server = _embedded(ctx)

    def go() -> None:
        with console.status("Starting the embedded PostgreSQL server…"):
            server.start()
        console.print(f"PostgreSQL is running on 127.0.0.1:{server.port} (data in {server.root})")

    _run(go)


@db_app.command("stop")
def db_stop(
    ctx: typer.Context,
    immediate: Annotated[bool, typer.Option(help="Abort connections without a checkpoint.")] = False,
) -> None:
    """Stop the embedded PostgreSQL server."""
    server = _embedded(ctx)
    stopped = _run(lambda: server.stop("immediate" if immediate else "fast"))
    console.print("PostgreSQL stopped" if stopped else "PostgreSQL was not running")


@db_app.command("status")
def db_status(ctx: typer.Context) -> None:
    """Say whether the embedded server is initialised and running."""
    status = _embedded(ctx).status()
    state = "running" if status.running else "stopped"
    console.print(
        f"embedded PostgreSQL: {state}; port {status.port}; "
        f"initialised: {'yes' if status.initialized else 'no'}; data: {status.data_dir}"
    )
    if not status.running:
        raise typer.Exit(3)


@db_app.command("dsn")
def db_dsn(ctx: typer.Context) -> None:
    """Print the embedded server's DSN (it contains the generated password)."""
    server = _embedded(ctx)
    dsn = _run(server.dsn)
    typer.echo(dsn)


# ------------------------------------------------------------- install


@app.command()
def install(ctx: typer.Context) -> None:
    """Install or upgrade pgtrickle's catalog and SQL API in the database (idempotent)."""
    from pgtrickle.catalog.install import install as do_install

    def go() -> None:
        dsn = _dsn(ctx)
        with connect(dsn) as conn:
            result = do_install(conn)
        applied = ", ".join(result.applied) if result.applied else "none (already current)"
        console.print(
            f"pgtrickle catalog version {result.current_version} in {redact(dsn)}; "
            f"migrations applied: {applied}"
        )
        if not result.event_triggers:
            console.print(
                "[yellow]note:[/] not a superuser, so DDL tracking (event triggers) is off: "
                "a source dropped with CASCADE is noticed at the next refresh instead."
            )
        capture_repairs(console, result.repaired)

    _run(go)


# ------------------------------------------------------------- refresh


@app.command()
def refresh(
    ctx: typer.Context,
    names: Annotated[
        list[str] | None, typer.Argument(help="Stream tables to refresh.", show_default=False)
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="Refresh every stream table.")] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Pass an open circuit breaker and a closed watermark gate.")
    ] = False,
    json_: Annotated[
        bool,
        typer.Option("--json", help="Print one JSON document: each stream table's outcome and the summary."),
    ] = False,
    spark_remote: Annotated[str | None, typer.Option(help=SPARK_REMOTE_HELP, show_default=False)] = None,
) -> None:
    """Refresh stream tables now, upstream first, and wait for the result.

    A failed refresh does not stop the others; a stream table whose upstream
    failed is skipped. Exit status 0 when none failed, 1 otherwise. A named
    stream table whose circuit breaker is open, or whose watermark gate is
    closed, is refused unless --force (with --all it is skipped and reported).
    """
    from pgtrickle.daemon.manual import refresh_all, summarize

    if not names and not all_:
        _fail("name one or more stream tables, or give --all")
    if names and all_:
        _fail("give either stream table names or --all, not both")

    def go() -> int:
        settings = _remote(ctx, spark_remote)
        dsn = _dsn(ctx, quiet=json_)
        spinner = err_console if json_ else console
        with spinner.status("Refreshing (the first Spark job of a process takes a few seconds)…") as status:
            results = refresh_all(
                settings,
                dsn,
                None if all_ else names,
                progress=lambda msg: status.update(escape(msg)),
                force=force,
            )
        if json_:
            typer.echo(dumps(refresh_document(results)))
        else:
            refresh_results(console, results)
        return summarize(results).exit_code

    code = _run(go)
    if code:
        raise typer.Exit(code)


@app.command()
def run(
    ctx: typer.Context,
    once: Annotated[bool, typer.Option(help="Run one scheduler tick and exit.")] = False,
    tick: Annotated[
        float | None, typer.Option(help="Seconds between ticks when nothing is notified.", show_default=False)
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="Serve Prometheus metrics on this port at /metrics ($PGTRICKLE_METRICS_PORT; default: off).",
            show_default=False,
        ),
    ] = None,
    metrics_address: Annotated[
        str | None,
        typer.Option(
            help="Address of the metrics server ($PGTRICKLE_METRICS_ADDRESS, default 127.0.0.1).",
            show_default=False,
        ),
    ] = None,
    spark_remote: Annotated[str | None, typer.Option(help=SPARK_REMOTE_HELP, show_default=False)] = None,
    max_parallel_refreshes: Annotated[
        int | None,
        typer.Option(
            help="Refreshes run at once ($PGTRICKLE_MAX_PARALLEL_REFRESHES; default: cores, at most 4; "
            "1: one at a time).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run the daemon: refresh due stream tables in dependency order until stopped."""
    from pgtrickle.daemon.loop import Scheduler

    def go() -> None:
        settings = _remote(ctx, spark_remote).with_overrides(
            tick_seconds=tick,
            metrics_port=metrics_port,
            metrics_address=metrics_address,
            max_parallel_refreshes=max_parallel_refreshes,
        )
        dsn = _dsn(ctx)
        scheduler = Scheduler(
            settings,
            dsn,
            on_outcome=lambda o: console.print(
                escape(
                    f"{o.st.display}: {o.action.value} ({o.reason}) +{o.rows_inserted:,} "
                    f"-{o.rows_deleted:,} in {o.seconds:.2f}s"
                ),
                highlight=False,
            ),
        )
        console.print(
            escape(
                f"pgtrickle daemon on {redact(dsn)}, {_spark_where(settings)}, "
                f"{settings.max_parallel_refreshes} refresh(es) at once; Ctrl-C to stop"
            ),
            highlight=False,
        )
        try:
            # Start Spark now: a master or Java that cannot work is a clear error here, not a failed
            # (and eventually suspended) refresh of every stream table later.
            from pgtrickle.spark.session import get_spark

            with console.status(escape(f"Starting Spark ({_spark_where(settings)})…")):
                get_spark(settings)
            port = scheduler.start_metrics()
            if port is not None:
                console.print(
                    f"Prometheus metrics on http://{settings.metrics_address}:{port}/metrics", highlight=False
                )
            scheduler.run(max_ticks=1 if once else None)
        finally:
            scheduler.close()
        console.print("stopped")

    _run(go)


# -------------------------------------------------------------- status


def status_view(dsn: str, *, alerts_shown: int = 5, width: int | None = None, wide: bool = False) -> Group:
    """Everything ``pgtrickle status`` shows, read now from the catalog, laid out for ``width`` cells."""
    return render.status_view(load_status(dsn, alerts_shown=alerts_shown), width or console.width, wide=wide)


@app.command()
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
        _fail("--json prints one document: give --json or --watch, not both")

    def intact(dsn: str) -> bool:
        with connect(dsn) as conn:
            return not find_broken(conn)

    def go() -> bool:
        dsn = _dsn(ctx, quiet=json_)
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

    if not _run(go):
        raise typer.Exit(2)


@app.command()
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
        dsn = _dsn(ctx)
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

    if not _run(go):
        raise typer.Exit(1)


@app.command()
def explain(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Stream table to explain.", show_default=False)],
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON document (see docs/CLI.md).")] = False,
) -> None:
    """Say which refresh mode a stream table gets (FULL or DIFFERENTIAL) and why.

    Analyses the defining query now and records the result, so that
    pgtrickle.explain_refresh_mode() in SQL shows it too.
    """
    from pgtrickle.catalog.store import load_stream_tables
    from pgtrickle.dvm.analysis import analyze
    from pgtrickle.refresh.plan import READS_CLOCK_REASON

    def go() -> None:
        with connect(_dsn(ctx, quiet=json_)) as conn:
            pgt_id = int(scalar(conn, "SELECT (pgtrickle._find_st(%s)).pgt_id", (name,)))
            st = load_stream_tables(conn, only=pgt_id)[pgt_id]
            analysis = analyze(st.normalized_query)
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
            if json_:
                typer.echo(dumps(explain_document(st.display, st.refresh_mode, mode, reason)))
                return
            console.print(
                f"{escape(st.display)}: refresh_mode {st.refresh_mode} → [bold]{mode}[/]", highlight=False
            )
            console.print(f"  {escape(reason)}", highlight=False)
            if mode == "ERROR":
                console.print(
                    "  refresh_mode DIFFERENTIAL cannot run this query; use AUTO or FULL.", highlight=False
                )

    _run(go)


# ---------------------------------------------------------- watermarks


@app.command()
def watermarks(ctx: typer.Context) -> None:
    """Show watermark groups (aligned or not, lag, effective watermark) and every source's watermark."""
    from pgtrickle.catalog.install import require_installed
    from pgtrickle.db.instants import tolerant_cursor

    def ts(value) -> str:
        return value.strftime("%Y-%m-%d %H:%M:%S%z") if value is not None else "-"

    def go() -> None:
        with connect(_dsn(ctx)) as conn:
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
                _fmt_interval(lag),
                _fmt_interval(tolerance),
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

    _run(go)


# ---------------------------------------------------------------- demo


@app.command()
def demo(
    ctx: typer.Context,
    rounds: Annotated[int, typer.Option(help="Rounds of writes and refreshes.")] = 3,
) -> None:
    """Run the orders / order_lines example end to end on the embedded default."""
    from pgtrickle.demo import run_demo

    def go() -> None:
        dsn = _dsn(ctx)
        run_demo(_settings(ctx), dsn, console, rounds=rounds)

    _run(go)


def entrypoint() -> None:  # pragma: no cover
    sys.exit(app())
