"""The command line's side of daemon-served refreshes (daemon/serve.py is the daemon's).

Kept light — psycopg and the pure decisions only, no Spark, no refresh engine —
so a ``pgtrickle refresh`` served by a daemon does not pay their import time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import psycopg

from pgtrickle.daemon.serving import (
    DONE_CHANNEL,
    INTERRUPTED_EXIT_CODE,
    TIMEOUT_EXIT_CODE,
    CommandState,
    Step,
    next_step,
    poll_delay,
)
from pgtrickle.db.connection import connect
from pgtrickle.errors import PgTrickleError


class DaemonTimeout(PgTrickleError):
    """``pgtrickle refresh`` waited ``--timeout`` seconds for the daemon (exit status 3)."""

    exit_code = TIMEOUT_EXIT_CODE


class WaitInterrupted(PgTrickleError):
    """Ctrl-C while waiting for the daemon (exit status 130); ``withdrawn``: nothing was refreshed."""

    exit_code = INTERRUPTED_EXIT_CODE

    def __init__(self, message: str, withdrawn: bool) -> None:
        super().__init__(message)
        self.withdrawn = withdrawn


@dataclass(frozen=True)
class Served:
    """What the daemon answered: the result document, or the error that refused the command."""

    document: dict[str, Any] | None
    error: str | None
    daemon_pid: int


def serving_daemons(conn: psycopg.Connection) -> list[int]:
    """Backend pids of the daemons serving this database now (empty: none)."""
    return [int(r[0]) for r in conn.execute("SELECT pgtrickle._serving_daemons()").fetchall()]


def submit(conn: psycopg.Connection, names: Sequence[str] | None, force: bool) -> int:
    """Queue a command (``names`` None: every stream table); raises what an unknown name or a
    stream table the caller may not refresh raises. Returns its id."""
    row = conn.execute(
        "SELECT pgtrickle._api_submit_refresh(%s, %s, pg_catalog.current_setting('search_path'))",
        (None if names is None else list(names), force),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _read(conn: psycopg.Connection, command_id: int) -> tuple[CommandState, Any, str | None]:
    row = conn.execute(
        "SELECT claimed_by, finished_at IS NOT NULL, result, error FROM pgtrickle.pgt_refresh_commands"
        " WHERE command_id = %s",
        (command_id,),
    ).fetchone()
    if row is None:
        return CommandState(False), None, None
    return CommandState(True, row[0], bool(row[1])), row[2], row[3]


def forget(conn: psycopg.Connection, command_id: int, *, only_unclaimed: bool) -> bool:
    """Delete the caller's command (``only_unclaimed``: only if no daemon took it). Whether it did."""
    row = conn.execute(
        "SELECT pgtrickle._api_forget_refresh_command(%s, %s)", (command_id, only_unclaimed)
    ).fetchone()
    return bool(row and row[0])


def _give_up(conn: psycopg.Connection, command_id: int) -> bool:
    """Withdraw the command if no daemon took it yet (True), else let the daemon finish it unwatched."""
    if forget(conn, command_id, only_unclaimed=True):
        return True
    forget(conn, command_id, only_unclaimed=False)
    return False


def wait_for(
    dsn: str,
    conn: psycopg.Connection,
    command_id: int,
    timeout: float,
    *,
    on_claimed: Callable[[int], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Served | None:
    """Wait for the daemon's answer to ``command_id``. None: no live daemon will give one (the
    command is withdrawn; refresh in this process). Raises :class:`DaemonTimeout` after
    ``timeout`` seconds and :class:`WaitInterrupted` on Ctrl-C."""
    conn.execute(f"LISTEN {DONE_CHANNEL}")
    started = clock()
    attempt = 0
    claimed: int | None = None
    try:
        while True:
            live = serving_daemons(conn)  # before the command: see serving.next_step
            state, result, error = _read(conn, command_id)
            if state.claimed_by is not None and claimed is None:
                claimed = state.claimed_by
                if on_claimed is not None:
                    on_claimed(claimed)
            step = next_step(state, live, clock() - started, timeout)
            if step is Step.DONE:
                forget(conn, command_id, only_unclaimed=False)
                assert state.claimed_by is not None
                return Served(result, error, state.claimed_by)
            if step is Step.RUN_HERE:
                if state.claimed_by is None and not forget(conn, command_id, only_unclaimed=True):
                    continue  # a daemon took it just now
                forget(conn, command_id, only_unclaimed=False)
                return None
            if step is Step.GONE:
                raise PgTrickleError(
                    f"refresh command {command_id} was deleted from pgtrickle.pgt_refresh_commands "
                    "before a daemon answered it; run the refresh again"
                )
            if step is Step.TIMEOUT:
                raise _timeout(_give_up(conn, command_id), timeout, state.claimed_by)
            for _ in conn.notifies(timeout=poll_delay(attempt), stop_after=1):
                pass
            attempt += 1
    except KeyboardInterrupt:
        raise _interrupted(dsn, command_id) from None


def _timeout(withdrawn: bool, timeout: float, daemon_pid: int | None) -> DaemonTimeout:
    if withdrawn:
        return DaemonTimeout(
            f"no pgtrickle daemon started the refresh within {timeout:g}s (is another process refreshing "
            "these stream tables?); the request was withdrawn and nothing was refreshed: try again, "
            "give a longer --timeout, or refresh in this process with --inline"
        )
    return DaemonTimeout(
        f"the pgtrickle daemon (backend pid {daemon_pid}) did not finish the refresh within {timeout:g}s; "
        "it goes on with it (pgtrickle status and pgtrickle.pgt_refresh_history show the result); "
        "give a longer --timeout to wait for it"
    )


def _interrupted(dsn: str, command_id: int) -> WaitInterrupted:
    # A new connection: the interrupted one may be in the middle of a wait.
    withdrawn = False
    with suppress(psycopg.Error, PgTrickleError), connect(dsn, application_name="pgtrickle-refresh") as conn:
        withdrawn = _give_up(conn, command_id)
    if withdrawn:
        return WaitInterrupted(
            "interrupted: the refresh was withdrawn before a daemon started it; nothing was refreshed", True
        )
    return WaitInterrupted(
        "interrupted: the pgtrickle daemon had started the refresh and finishes it "
        "(pgtrickle status and pgtrickle.pgt_refresh_history show the result)",
        False,
    )
