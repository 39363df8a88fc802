"""What every ``pgtrickle`` command uses: the consoles, the global settings, the DSN, clean errors."""

from __future__ import annotations

import psycopg
import typer
from rich.console import Console
from rich.markup import escape

from pgtrickle.config import Settings
from pgtrickle.daemon.serving import error_text
from pgtrickle.db.connection import resolve_dsn
from pgtrickle.db.redaction import scrub
from pgtrickle.errors import PgTrickleError

console = Console()


err_console = Console(stderr=True)


SPARK_REMOTE_HELP = (
    "Run every refresh on this Spark Connect server, e.g. sc://spark-host:15002 "
    "($PGTRICKLE_SPARK_REMOTE); no local Java needed. The server reads PostgreSQL itself."
)


def settings_of(ctx: typer.Context) -> Settings:
    return ctx.obj


def remote_settings(ctx: typer.Context, spark_remote: str | None) -> Settings:
    """The settings, with a command's own --spark-remote (checked: a bad URL is refused here)."""
    settings = settings_of(ctx).with_overrides(spark_remote=spark_remote)
    if settings.spark_remote is not None:
        from pgtrickle.spark.connect import parse_remote

        parse_remote(settings.spark_remote)
    return settings


def spark_where(settings: Settings) -> str:
    if settings.spark_remote is None:
        return f"Spark master {settings.spark_master}"
    from pgtrickle.spark.connect import parse_remote

    return f"Spark Connect server {parse_remote(settings.spark_remote).shown}"


def fail(message: str, code: int = 1) -> None:
    err_console.print(f"[bold red]error:[/] {escape(scrub(message))}", highlight=False)
    raise typer.Exit(code)


def run_cleanly(fn):
    """Turn pgtrickle and PostgreSQL errors into a clean message and exit code 1."""
    try:
        return fn()
    except PgTrickleError as exc:
        fail(str(exc))
    except psycopg.Error as exc:
        fail(error_text(exc))
    return None


def dsn_of(ctx: typer.Context, *, quiet: bool = False) -> str:
    """The database's DSN (starting the embedded server if needed; its spinner on stderr when ``quiet``)."""
    settings = settings_of(ctx)
    if settings.dsn is None:
        with (err_console if quiet else console).status("Starting the embedded PostgreSQL server…"):
            return resolve_dsn(settings)
    return resolve_dsn(settings)
