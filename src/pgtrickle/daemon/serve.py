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

The command line side is daemon/serve_client.py (light: no Spark imported);
the decisions are pure (daemon/serving.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Json

from pgtrickle.daemon.loop import LOCK_NAMESPACE, Scheduler, TickReport
from pgtrickle.daemon.manual import Result, refresh_on, results_document
from pgtrickle.daemon.serving import (
    DAEMON_LOCK,
    DONE_CHANNEL,
    RESULT_RETENTION_SECONDS,
    error_text,
    may_claim,
)
from pgtrickle.db.redaction import scrub
from pgtrickle.errors import PgTrickleError
from pgtrickle.refresh.engine import Cancelled

log = logging.getLogger(__name__)

PRUNE_EVERY_SECONDS = 60.0

ABANDONED = (
    "the pgtrickle daemon was stopped while refreshing: the refresh was abandoned "
    "and the stream tables keep their previous contents"
)


@dataclass(frozen=True)
class Command:
    command_id: int
    pgt_ids: list[int] | None
    force: bool


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

    def tick(self, changed_relids: Iterable[int | None] = ()) -> TickReport:
        self.serve_commands()
        return super().tick(changed_relids)

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
