"""The ``pgtrickle`` command line: the typer app, its global options, and every command registered.

The commands are in ``cli/commands_*.py``, plain functions registered below in
the order ``pgtrickle --help`` lists them.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from pgtrickle.cli import commands_db, commands_refresh, commands_status, commands_watermarks
from pgtrickle.cli.commands_status import status_view
from pgtrickle.cli.common import SPARK_REMOTE_HELP, fail
from pgtrickle.config import Settings
from pgtrickle.db.redaction import install_log_redaction, register_dsn
from pgtrickle.errors import PgTrickleError

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

__all__ = ["app", "entrypoint", "status_view"]


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
        fail(str(exc))


db_app.command("start")(commands_db.db_start)
db_app.command("stop")(commands_db.db_stop)
db_app.command("status")(commands_db.db_status)
db_app.command("dsn")(commands_db.db_dsn)
app.command()(commands_db.install)
app.command()(commands_refresh.refresh)
app.command()(commands_refresh.run)
app.command()(commands_status.status)
app.command()(commands_status.verify)
app.command()(commands_status.explain)
app.command()(commands_status.history)
app.command()(commands_watermarks.watermarks)
app.command()(commands_refresh.demo)


def entrypoint() -> None:  # pragma: no cover
    sys.exit(app())
