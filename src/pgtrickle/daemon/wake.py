"""When the daemon ticks again: the due times and source readers the last tick left behind.

The decisions are pure (:mod:`pgtrickle.scheduler.wake`, :func:`~pgtrickle.scheduler.policy.next_due_at`);
this keeps their state between ticks and waits on the listener connection.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

import psycopg

from pgtrickle.catalog.store import StreamTable
from pgtrickle.errors import ScheduleError
from pgtrickle.scheduler.policy import DueState, next_due_at
from pgtrickle.scheduler.schedule import Schedule
from pgtrickle.scheduler.wake import CHANGES_CHANNEL, changed_wake, parse_change, wait_seconds


class Wakes:
    """The state the wait between ticks needs."""

    def __init__(self) -> None:
        self.pending: dict[int, datetime] = {}
        """Stream tables with new input not refreshed yet (their schedule did not allow it): when each is due."""
        self.next_due: dict[int, datetime | None] = {}
        self.readers: dict[int, frozenset[int]] = {}
        self.applied: dict[int, datetime] = {}
        """When each stream table's last refresh that applied rows ended (the database's time), as
        far as this daemon saw: an interval schedule with new input counts from it
        (:func:`~pgtrickle.scheduler.policy.due_reason`)."""
        self.clock: tuple[datetime, float] | None = None
        """The database's time at the end of the last tick, and ``time.monotonic()`` then."""
        self.unfinished: set[int] = set()
        """Stream tables whose attempt in this tick failed or was skipped (a gate): not a refresh."""

    def ended(self, pgt_id: int, action: str, at: datetime) -> None:
        """A refresh or attempt of ``pgt_id`` ended at ``at`` with ``action`` (a refresh action,
        or ``FAILED``)."""
        if action in ("FULL", "DIFFERENTIAL"):
            self.applied[pgt_id] = at
        elif action in ("SKIP", "FAILED"):
            self.unfinished.add(pgt_id)

    def forget(self) -> None:
        self.pending, self.next_due, self.readers = {}, {}, {}

    def remember(
        self,
        sts: dict[int, StreamTable],
        schedules: dict[int, Schedule],
        state: Callable[[int], DueState],
        ended: dict[int, datetime],
        pending: dict[int, datetime],
        readers: dict[int, frozenset[int]],
        notified: set[int],
        at: datetime,
    ) -> None:
        """What the wait for the next tick needs: each stream table's next due time, and who reads what.

        A stream table refreshed because a source notified stays pending once more, until its next due
        time: a capture trigger notifies at most once per 100 ms per session, so changes committed just
        after the one that woke the daemon are picked up then, not at the next tick.
        """
        next_due: dict[int, datetime | None] = {}
        for pgt_id in sts:
            # Used when a change arrives for it (a notified source's readers, a pending stream table).
            current = replace(state(pgt_id), new_input=True)
            if pgt_id in self.unfinished:
                current = replace(current, last_attempt_at=ended[pgt_id])
            elif pgt_id in ended:
                current = replace(current, last_refresh_at=ended[pgt_id], last_attempt_at=ended[pgt_id])
            try:
                next_due[pgt_id] = next_due_at(current, schedules[pgt_id], at)
            except (ScheduleError, ValueError):
                next_due[pgt_id] = None
        for pgt_id in notified & ended.keys():
            when = next_due.get(pgt_id)
            if when is not None:
                pending.setdefault(pgt_id, when)
        self.pending = pending
        self.next_due = next_due
        self.applied = {k: v for k, v in self.applied.items() if k in sts}
        self.unfinished = set()
        self.readers = readers
        self.clock = (at, time.monotonic())

    def wait(
        self, listener: psycopg.Connection, tick_seconds: float, stopped: Callable[[], bool]
    ) -> set[int | None]:
        """Wait for the next tick; returns the sources notified as changed meanwhile.

        The tick comes after ``tick_seconds``; at once on ``NOTIFY pgtrickle_refresh``; at the
        due time of a :attr:`pending` stream table; and on ``NOTIFY pgtrickle_changes`` at the
        first due time of the stream tables reading that source (scheduler/wake.py).
        """
        changed: set[int | None] = set()
        db_then, mono_then = self.clock or (None, time.monotonic())
        deadline = time.monotonic() + tick_seconds

        def db_now() -> datetime | None:
            return None if db_then is None else db_then + timedelta(seconds=time.monotonic() - mono_then)

        def at_mono(when: datetime) -> float:
            current = db_now()
            assert current is not None
            return time.monotonic() + (when - current).total_seconds()

        if db_then is not None and self.pending:
            current = db_now()
            assert current is not None
            deadline = time.monotonic() + wait_seconds(current, tick_seconds, self.pending.values())
        while not stopped():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            notified = False
            for note in listener.notifies(timeout=remaining, stop_after=1):
                notified = True
                if note.channel != CHANGES_CHANNEL:
                    return changed
                relid = parse_change(note.payload)
                changed.add(relid)
                current = db_now()
                if current is None:
                    return changed
                wake, _ = changed_wake([relid], self.readers, self.next_due, current)
                if wake is not None:
                    deadline = min(deadline, at_mono(wake))
            if not notified:
                break
        return changed
