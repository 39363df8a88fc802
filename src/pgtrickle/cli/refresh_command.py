"""``pgtrickle refresh``: served by a running daemon when there is one, else run in this process.

Both ways print the same: the daemon stores the ``--json`` document
(``results_document``) and the text table is drawn from that document either
way; the exit status is the document's. An error that refuses the whole command
(an open circuit breaker, an unknown name) is printed as ``error: …`` with exit
status 1 either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from pgtrickle.catalog.install import require_installed
from pgtrickle.cli.json_output import dumps, served_document
from pgtrickle.cli.reports import refresh_results
from pgtrickle.config import Settings
from pgtrickle.db.connection import connect
from pgtrickle.errors import PgTrickleError

NO_DAEMON = (
    "note: no pgtrickle daemon is running on this database: refreshing in this process "
    "(starting Spark takes a few seconds)"
)
DAEMON_GONE = "note: the pgtrickle daemon stopped before answering: refreshing in this process"


class RefusedByDaemon(PgTrickleError):
    """The daemon refused the whole command (the error it stored is the message)."""


def run_refresh(
    settings: Settings,
    dsn: str,
    names: Sequence[str] | None,
    *,
    force: bool,
    json_: bool,
    timeout: float,
    inline: bool,
    console: Console,
    err_console: Console,
) -> int:
    """Refresh ``names`` (None: every stream table), print the outcome; returns the exit status.

    Raises :class:`~pgtrickle.daemon.serve_client.DaemonTimeout` and
    :class:`~pgtrickle.daemon.serve_client.WaitInterrupted` (the caller maps them to exit statuses).
    """
    spinner = err_console if json_ else console
    if not inline:
        body = _by_daemon(dsn, names, force=force, timeout=timeout, spinner=spinner, err_console=err_console)
        if body is not None:
            return _show(body, json_, console)
    from pgtrickle.daemon.manual import refresh_all, results_document

    with spinner.status("Refreshing (the first Spark job of a process takes a few seconds)…") as status:
        results = refresh_all(
            settings, dsn, names, progress=lambda msg: status.update(escape(msg)), force=force
        )
    return _show(results_document(results), json_, console)


def _show(body: dict[str, Any], json_: bool, console: Console) -> int:
    if json_:
        typer.echo(dumps(served_document(body)))
    else:
        refresh_results(console, body)
    return int(body["summary"]["exit_code"])


def _by_daemon(
    dsn: str,
    names: Sequence[str] | None,
    *,
    force: bool,
    timeout: float,
    spinner: Console,
    err_console: Console,
) -> dict[str, Any] | None:
    """The daemon's result document; None (after saying so on stderr) when no daemon answers."""
    from pgtrickle.daemon.serve_client import serving_daemons, submit, wait_for

    with connect(dsn, application_name="pgtrickle-refresh") as conn:
        require_installed(conn)
        if not serving_daemons(conn):
            err_console.print(NO_DAEMON, highlight=False, soft_wrap=True)
            return None
        command_id = submit(conn, names, force)
        with spinner.status("Waiting for the pgtrickle daemon to take the refresh…") as status:
            served = wait_for(
                dsn,
                conn,
                command_id,
                timeout,
                on_claimed=lambda pid: status.update(
                    f"The pgtrickle daemon (backend pid {pid}) is refreshing…"
                ),
            )
    if served is None:
        err_console.print(DAEMON_GONE, highlight=False, soft_wrap=True)
        return None
    if served.error is not None:
        raise RefusedByDaemon(served.error)
    assert served.document is not None
    return served.document
