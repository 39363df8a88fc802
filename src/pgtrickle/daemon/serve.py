"""Daemon-served refreshes: ``pgtrickle refresh`` hands its command to a running daemon.

The daemon side is :class:`Daemon` — the scheduler ``pgtrickle run`` runs. It
registers on its listener connection (the shared advisory lock
:data:`~pgtrickle.daemon.serving.DAEMON_LOCK`, released by PostgreSQL when the
connection ends, however the daemon ended) and, at the start of every tick,
claims the queued commands (``pgtrickle.pgt_refresh_commands``) and runs each
exactly as the command line would (:func:`~pgtrickle.daemon.manual.refresh_on`,
on its warm SparkSession), then stores the result document and NOTIFYs
:data:`~pgtrickle.daemon.serving.DONE_CHANNEL`. A NOTIFY on ``pgtrickle_refresh``
(sent by the submission) wakes it, so a command waits for no schedule — only
for the refresh the daemon may be running at that moment.

The command line side is :func:`serving_daemons`, :func:`submit` and
:func:`wait_for`: the decisions are pure (daemon/serving.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Json

from pgtrickle.daemon.loop import LOCK_NAMESPACE, Scheduler, TickReport
from pgtrickle.daemon.manual import Result, refresh_on, results_document
from pgtrickle.daemon.serving import (
    DAEMON_LOCK,
    DONE_CHANNEL,
    INTERRUPTED_EXIT_CODE,
    RESULT_RETENTION_SECONDS,
    TIMEOUT_EXIT_CODE,
    CommandState,
    Step,
    error_text,
    may_claim,
    next_step,
    poll_delay,
)
from pgtrickle.db.connection import connect
from pgtrickle.db.redaction import scrub
from pgtrickle.errors import PgTrickleError
from pgtrickle.refresh.engine import Cancelled

log = logging.getLogger(__name__)

PRUNE_EVERY_SECONDS = 60.0

ABANDONED = (
    "the pgtrickle daemon was stopped while refreshing: the refresh was abandoned "
    "and the stream tables keep their previous contents"
)


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
class Command:
    command_id: int
    pgt_ids: list[int] | None
    force: bool


@dataclass(frozen=True)
class Served:
    """What the daemon answered: the result document, or the error that refused the command."""

    document: dict[str, Any] | None
    error: str | None
    daemon_pid: int


# ------------------------------------------------------------------ daemon


class Daemon(Scheduler):
    """The scheduler of ``pgtrickle run``, which also serves ``pgtrickle refresh`` commands."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.serving_pid: int | None = None
        """Backend pid of the listener connection holding the daemon lock (None: not registered)."""
        self._last_prune = 0.0
        self.commands_served = 0
        """Refresh commands this daemon answered (results and refusals alike)."""

    def on_listen(self, listener: psycopg.Connection) -> None:
        listener.execute("SELECT pg_advisory_lock_shared(%s, %s)", DAEMON_LOCK)
        self.serving_pid = listener.info.backend_pid
        log.info("serving pgtrickle refresh commands (listener pid %d)", self.serving_pid)

    def tick(self) -> TickReport:
        self.serve_commands()
        return super().tick()

    def serve_commands(self) -> int:
        """Run every queued command this daemon may take now; returns how many it ran."""
        if self.serving_pid is None:
            return 0
        served = 0
        while not self.stop_requested:
            command = self._claim()
            if command is None:
                break
            served += 1
            self.commands_served += 1
            self._serve(command)
        if time.monotonic() - self._last_prune >= PRUNE_EVERY_SECONDS:
            self._last_prune = time.monotonic()
            self._prune()
        return served

    def _locked_elsewhere(self) -> set[int]:
        """Stream tables whose advisory lock another session holds (being refreshed elsewhere)."""
        rows = self.conn.execute(
            "SELECT objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND classid = %s AND objsubid = 2 AND pid <> pg_backend_pid()"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            (LOCK_NAMESPACE,),
        ).fetchall()
        return {int(r[0]) for r in rows}

    def _claim(self) -> Command | None:
        queued = self.conn.execute(
            "SELECT command_id, pgt_ids FROM pgtrickle.pgt_refresh_commands"
            " WHERE claimed_by IS NULL ORDER BY command_id"
        ).fetchall()
        if not queued:
            return None
        locked = self._locked_elsewhere()
        for command_id, pgt_ids in queued:
            if not may_claim(pgt_ids, locked):
                continue
            row = self.conn.execute(
                "UPDATE pgtrickle.pgt_refresh_commands SET claimed_by = %s, claimed_at = clock_timestamp()"
                " WHERE command_id = %s AND claimed_by IS NULL RETURNING command_id, pgt_ids, force",
                (self.serving_pid, command_id),
            ).fetchone()
            if row is not None:  # else another daemon took it first
                return Command(
                    int(row[0]), None if row[1] is None else [int(i) for i in row[1]], bool(row[2])
                )
        return None

    def _serve(self, command: Command) -> None:
        log.info("refresh command %d: %s", command.command_id, command.pgt_ids or "every stream table")
        try:
            results = refresh_on(self, command.pgt_ids, force=command.force)
        except Cancelled:
            self._finish(command.command_id, error=ABANDONED)
            raise
        except Exception as exc:
            if self.connection_lost():
                raise  # the run loop reconnects; the command line sees this daemon's lock gone
            if isinstance(exc, (PgTrickleError, psycopg.Error)):
                text = error_text(exc)
            else:
                log.exception("refresh command %d failed unexpectedly", command.command_id)
                text = f"{type(exc).__name__}: {exc}"
            self._finish(command.command_id, error=scrub(text))
            return
        self._finish(command.command_id, result=results_document(results))
        for r in results:
            if r.outcome is not None:
                self.metrics.observe_outcome(r.outcome)
                self.on_outcome(r.outcome)
            elif r.result is Result.FAILED:
                self.metrics.observe_failure(r.st.display)

    def _finish(
        self, command_id: int, *, result: dict[str, Any] | None = None, error: str | None = None
    ) -> None:
        """Store the answer and wake the waiting command line, in one statement (one transaction)."""
        self.conn.execute(
            "WITH done AS (UPDATE pgtrickle.pgt_refresh_commands SET finished_at = clock_timestamp(),"
            " result = %s, error = %s WHERE command_id = %s RETURNING command_id)"
            " SELECT pg_notify(%s, command_id::text) FROM done",
            (Json(result) if result is not None else None, error, command_id, DONE_CHANNEL),
        )

    def _prune(self) -> None:
        """Commands nobody collected (their command line was killed) or whose daemon died, after a while."""
        deleted = self.conn.execute(
            "DELETE FROM pgtrickle.pgt_refresh_commands WHERE requested_at < now() - make_interval(secs => %s)"
            " AND (finished_at IS NOT NULL"
            "      OR (claimed_by IS NOT NULL AND claimed_by NOT IN (SELECT pgtrickle._serving_daemons())))",
            (RESULT_RETENTION_SECONDS,),
        ).rowcount
        if deleted:
            log.info("removed %d refresh command result(s) nobody collected", deleted)


# ------------------------------------------------------------ command line


def serving_daemons(conn: psycopg.Connection) -> list[int]:
    """Backend pids of the daemons serving this database now (empty: none)."""
    return [int(r[0]) for r in conn.execute("SELECT pgtrickle._serving_daemons()").fetchall()]


def submit(conn: psycopg.Connection, names: Sequence[str] | None, force: bool) -> int:
    """Queue a command (``names`` None: every stream table); raises what an unknown name or a
    stream table the caller may not refresh raises. Returns its id."""
    row = conn.execute(
        "SELECT pgtrickle._submit_refresh(%s, %s, pg_catalog.current_setting('search_path'))",
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
        "SELECT pgtrickle._forget_refresh_command(%s, %s)", (command_id, only_unclaimed)
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
