"""``pgtrickle refresh`` (now, and wait), ``pgtrickle run`` (the daemon) and ``pgtrickle demo``."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from pgtrickle.cli.common import (
    SPARK_REMOTE_HELP,
    console,
    dsn_of,
    err_console,
    fail,
    remote_settings,
    run_cleanly,
    settings_of,
    spark_where,
)
from pgtrickle.daemon.serving import DEFAULT_TIMEOUT_SECONDS
from pgtrickle.db.connection import redact


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
    inline: Annotated[
        bool, typer.Option("--inline", help="Refresh in this process even when a daemon is running.")
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(help="Seconds to wait for a running daemon's result (exit status 3 past it).", min=0.1),
    ] = DEFAULT_TIMEOUT_SECONDS,
    spark_remote: Annotated[
        str | None,
        typer.Option(help=SPARK_REMOTE_HELP + " Refreshes in this process.", show_default=False),
    ] = None,
) -> None:
    """Refresh stream tables now, upstream first, and wait for the result.

    A running daemon (pgtrickle run) does the refresh on its warm SparkSession;
    with none, this process does it (and says so on stderr). A failed refresh
    does not stop the others; a stream table whose upstream failed is skipped.
    Exit status 0 when none failed, 1 otherwise, 3 when the daemon did not answer
    within --timeout, 130 on Ctrl-C. A named stream table whose circuit breaker
    is open, or whose watermark gate is closed, is refused unless --force (with
    --all it is skipped and reported).
    """
    from pgtrickle.cli.refresh_command import run_refresh
    from pgtrickle.daemon.serve_client import DaemonTimeout, WaitInterrupted

    if not names and not all_:
        fail("name one or more stream tables, or give --all")
    if names and all_:
        fail("give either stream table names or --all, not both")

    def go() -> int:
        settings = remote_settings(ctx, spark_remote)
        dsn = dsn_of(ctx, quiet=json_)
        try:
            return run_refresh(
                settings,
                dsn,
                None if all_ else names,
                force=force,
                json_=json_,
                timeout=timeout,
                inline=inline or spark_remote is not None,
                console=console,
                err_console=err_console,
            )
        except (DaemonTimeout, WaitInterrupted) as exc:
            fail(str(exc), exc.exit_code)
        return 1

    code = run_cleanly(go)
    if code:
        raise typer.Exit(code)


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
    max_batch_size: Annotated[
        int | None,
        typer.Option(
            help="DIFFERENTIAL refreshes ready together that share one snapshot and one Spark job "
            "($PGTRICKLE_MAX_BATCH_SIZE; default 32; 1: each on its own).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run the daemon: refresh due stream tables in dependency order until stopped.

    It also serves `pgtrickle refresh` run while it is up (on its warm SparkSession).
    """
    from pgtrickle.daemon.serve import Daemon

    def go() -> None:
        settings = remote_settings(ctx, spark_remote).with_overrides(
            tick_seconds=tick,
            metrics_port=metrics_port,
            metrics_address=metrics_address,
            max_parallel_refreshes=max_parallel_refreshes,
            max_batch_size=max_batch_size,
        )
        dsn = dsn_of(ctx)
        scheduler = Daemon(
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
                f"pgtrickle daemon on {redact(dsn)}, {spark_where(settings)}, "
                f"{settings.max_parallel_refreshes} refresh(es) at once; Ctrl-C to stop"
            ),
            highlight=False,
        )
        try:
            # Start Spark now: a master or Java that cannot work is a clear error here, not a failed
            # (and eventually suspended) refresh of every stream table later.
            from pgtrickle.spark.session import get_spark

            with console.status(escape(f"Starting Spark ({spark_where(settings)})…")):
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

    run_cleanly(go)


def demo(
    ctx: typer.Context,
    rounds: Annotated[int, typer.Option(help="Rounds of writes and refreshes.")] = 3,
) -> None:
    """Run the orders / order_lines example end to end on the embedded default."""
    from pgtrickle.demo import run_demo

    def go() -> None:
        dsn = dsn_of(ctx)
        run_demo(settings_of(ctx), dsn, console, rounds=rounds)

    run_cleanly(go)
