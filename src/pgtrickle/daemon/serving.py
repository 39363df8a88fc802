"""Decisions of daemon-served refreshes (pure: no database, no Spark).

``pgtrickle refresh`` hands its command to a running daemon when one serves
the database (the daemon's SparkSession is warm, so a small refresh takes a
fraction of a second instead of the seconds a new session needs), and waits
for the result. How a daemon is recognised: it holds the shared advisory lock
:data:`DAEMON_LOCK` on its listener connection for as long as it runs, and
PostgreSQL releases the lock when that connection ends however the daemon
ended — a daemon that crashed or was killed is never taken for a live one.

While waiting, the command line looks at its command and at the live daemons
and decides with :func:`next_step`; between looks it sleeps for
:func:`poll_delay` (a NOTIFY on :data:`DONE_CHANNEL` wakes it as soon as the
result is stored). A daemon claims a command with :func:`may_claim`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum

DAEMON_LOCK = (0x70677464, 1)
"""The shared advisory lock (two int4 keys, "pgtd", 1) a serving daemon holds (also known to
sql/api/80_served_refresh.sql)."""
DONE_CHANNEL = "pgtrickle_refresh_done"
"""NOTIFY channel the daemon signals on (payload: the command id) when a command's result is stored."""
DEFAULT_TIMEOUT_SECONDS = 600.0
"""How long ``pgtrickle refresh`` waits for a daemon by default (``--timeout``)."""
RESULT_RETENTION_SECONDS = 3600.0
"""A finished command nobody collected (its command line was killed) is deleted after this long."""
TIMEOUT_EXIT_CODE = 3
"""Exit status of ``pgtrickle refresh`` when the daemon did not answer within ``--timeout``."""
INTERRUPTED_EXIT_CODE = 130
"""Exit status of ``pgtrickle refresh`` interrupted (Ctrl-C) while waiting for the daemon."""


@dataclass(frozen=True)
class CommandState:
    """A served command as last read (``exists`` False: its row is gone)."""

    exists: bool
    claimed_by: int | None = None
    finished: bool = False


class Step(Enum):
    DONE = "done"
    """The daemon stored the result (or the error that refused the command): show it."""
    WAIT = "wait"
    """Not finished, and the daemon that has it (or could take it) is alive."""
    RUN_HERE = "run here"
    """No live daemon will finish it: withdraw it and refresh in this process."""
    TIMEOUT = "timeout"
    """Waited ``--timeout`` seconds."""
    GONE = "gone"
    """Its row disappeared (deleted by hand): nothing to report."""


def next_step(state: CommandState, live: Collection[int], elapsed: float, timeout: float) -> Step:
    """What the waiting command line does now.

    ``live``: the backend pids holding :data:`DAEMON_LOCK`, read *before* ``state``
    (a daemon that finished and exited in between is then seen finished, never dead).
    """
    if not state.exists:
        return Step.GONE
    if state.finished:
        return Step.DONE
    if state.claimed_by is None and not live:
        return Step.RUN_HERE
    if state.claimed_by is not None and state.claimed_by not in live:
        # The daemon that took it is gone: its refresh was rolled back, or committed and the
        # next one finds nothing to do. Either way refreshing here is safe (exactly once holds).
        return Step.RUN_HERE
    if elapsed >= timeout:
        return Step.TIMEOUT
    return Step.WAIT


def poll_delay(attempt: int, *, first: float = 0.02, cap: float = 0.5) -> float:
    """Seconds to wait for the result NOTIFY before looking again (doubling from ``first`` to ``cap``).

    The NOTIFY ends the wait at once; looking again catches a daemon that died meanwhile.
    """
    return min(cap, first * (2 ** max(0, attempt)))


def may_claim(wanted: Collection[int] | None, locked_elsewhere: Collection[int]) -> bool:
    """Whether a daemon takes a command for ``wanted`` (None: every stream table).

    A named stream table another process is refreshing right now is left to that process: the
    daemon holding it takes the command once its refresh is done (taking it here would only
    report it as failed, "being refreshed by another process"). ``--all`` is taken at once.
    """
    if wanted is None:
        return True
    return not set(wanted) & set(locked_elsewhere)


def error_text(exc: BaseException) -> str:
    """The one-line error the command line prints for ``exc`` (PostgreSQL's hint on a line of its own)."""
    diag = getattr(exc, "diag", None)
    if diag is not None and hasattr(diag, "message_hint"):  # a psycopg error from PostgreSQL
        text = str(exc)
        hint = f"\nhint: {diag.message_hint}" if diag.message_hint else ""
        return f"{text.splitlines()[0] if text else type(exc).__name__}{hint}"
    return str(exc)


@dataclass(frozen=True)
class Summary:
    """How many stream tables a ``pgtrickle refresh`` refreshed, failed and skipped (daemon/manual.py)."""

    refreshed: int
    failed: int
    skipped: int

    @property
    def exit_code(self) -> int:
        """0: nothing failed; 1: some refresh failed (the others were still done)."""
        return 1 if self.failed else 0

    def text(self) -> str:
        total = self.refreshed + self.failed + self.skipped
        return (
            f"{total} stream table{'s' if total != 1 else ''}: {self.refreshed} refreshed, "
            f"{self.failed} failed, {self.skipped} skipped"
        )
