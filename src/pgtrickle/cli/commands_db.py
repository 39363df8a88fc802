"""``pgtrickle db start|stop|status|dsn`` (the embedded server) and ``pgtrickle install``."""

from __future__ import annotations

from typing import Annotated

import typer

from pgtrickle.cli.common import console, dsn_of, run_cleanly, settings_of
from pgtrickle.cli.reports import capture_repairs
from pgtrickle.db.connection import connect, redact


def _embedded(ctx: typer.Context):
    from pgtrickle.db.embedded import EmbeddedPostgres

    settings = settings_of(ctx)
    return EmbeddedPostgres(settings.data_dir, settings.embedded_port)


def db_start(ctx: typer.Context) -> None:
    """Initialise (first time) and start the embedded PostgreSQL server."""
    server = _embedded(ctx)

    def go() -> None:
        with console.status("Starting the embedded PostgreSQL server…"):
            server.start()
        console.print(f"PostgreSQL is running on 127.0.0.1:{server.port} (data in {server.root})")

    run_cleanly(go)


def db_stop(
    ctx: typer.Context,
    immediate: Annotated[bool, typer.Option(help="Abort connections without a checkpoint.")] = False,
) -> None:
    """Stop the embedded PostgreSQL server."""
    server = _embedded(ctx)
    stopped = run_cleanly(lambda: server.stop("immediate" if immediate else "fast"))
    console.print("PostgreSQL stopped" if stopped else "PostgreSQL was not running")


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


def db_dsn(ctx: typer.Context) -> None:
    """Print the embedded server's DSN (it contains the generated password)."""
    server = _embedded(ctx)
    dsn = run_cleanly(server.dsn)
    typer.echo(dsn)


def install(ctx: typer.Context) -> None:
    """Install or upgrade pgtrickle's catalog and SQL API in the database (idempotent)."""
    from pgtrickle.catalog.install import install as do_install

    def go() -> None:
        dsn = dsn_of(ctx)
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

    run_cleanly(go)
