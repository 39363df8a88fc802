"""Running one unit of a tick -- a stream table, or an atomic group -- on one worker.

A :class:`Worker` is one refresh slot: a :class:`~pgtrickle.refresh.engine.Refresher`
(its own PostgreSQL connection; with parallel refreshes its own Spark session
too) and the connection holding its advisory locks. A per-stream-table
session advisory lock keeps two processes (two daemons, a daemon and
``pgtrickle refresh``), and two workers, from refreshing one stream table at
once: a unit whose lock is held elsewhere is left for the next tick.

The functions here run in a worker's thread and touch only the worker's
connections; what they found goes back in a :class:`TickReport`, which the
daemon's main thread merges (metrics, callbacks).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import psycopg

from pgtrickle.catalog.store import StreamTable, load_stream_tables, upstream_ids
from pgtrickle.errors import PgTrickleError
from pgtrickle.refresh.batch import BatchRequest, refresh_batch
from pgtrickle.refresh.engine import Cancelled, Refresher, RefreshOutcome
from pgtrickle.refresh.group import refresh_group
from pgtrickle.scheduler.groups import GroupNode, RefreshGroup, in_group_upstream
from pgtrickle.scheduler.policy import DueReason, stopped_note

log = logging.getLogger(__name__)

LOCK_NAMESPACE = 0x70677472  # "pgtr": first key of every pgtrickle advisory lock


@dataclass
class TickReport:
    refreshed: list[RefreshOutcome] = field(default_factory=list)
    failed: list[tuple[StreamTable, str]] = field(default_factory=list)
    locked_elsewhere: list[StreamTable] = field(default_factory=list)

    def extend(self, other: TickReport) -> None:
        self.refreshed.extend(other.refreshed)
        self.failed.extend(other.failed)
        self.locked_elsewhere.extend(other.locked_elsewhere)


class StreamTableLocks:
    """Session-level advisory locks, one per stream table, on one connection."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn

    def try_lock(self, pgt_id: int) -> bool:
        row = self.conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (LOCK_NAMESPACE, pgt_id)).fetchone()
        return bool(row and row[0])

    def unlock(self, pgt_id: int) -> None:
        self.conn.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_NAMESPACE, pgt_id))


class LockedElsewhere(PgTrickleError):
    """A stream table (or a member of its group) is being refreshed by another process."""


@dataclass
class Worker:
    """One refresh slot: a refresher, and the connection that reads the catalog and holds the locks."""

    index: int
    refresher: Refresher
    conn: psycopg.Connection

    def __post_init__(self) -> None:
        self.locks = StreamTableLocks(self.conn)

    def connections(self) -> tuple[psycopg.Connection, ...]:
        return (self.conn, self.refresher.conn)


def group_nodes(sts: Mapping[int, StreamTable]) -> dict[int, GroupNode]:
    ups = upstream_ids(dict(sts))
    return {
        i: GroupNode(
            i,
            st.display,
            frozenset(s.relid for s in st.sources if s.kind == "TABLE"),
            ups[i],
            st.diamond_consistency == "atomic",
        )
        for i, st in sts.items()
    }


def initiated_by(st: StreamTable, reason: DueReason | None) -> str:
    """Who a refresh of ``st`` (due for ``reason``) is initiated by, in its history row."""
    if st.frontier is None:
        return "INITIAL"
    return "MANUAL" if reason is DueReason.REQUESTED else "SCHEDULER"


def refresh_one(
    worker: Worker, st: StreamTable, reason: DueReason, request_ids: Sequence[int], force: bool = False
) -> TickReport:
    """Refresh ``st`` under its advisory lock; a failure is reported, not raised (but :class:`Cancelled`)."""
    report = TickReport()
    if not worker.locks.try_lock(st.pgt_id):
        report.locked_elsewhere.append(st)
        return report
    try:
        # Re-read under the lock: another process may have refreshed it meanwhile.
        fresh = load_stream_tables(worker.conn, only=st.pgt_id).get(st.pgt_id)
        if fresh is None:
            return report
        if note := stopped_note(fresh.display, fresh.status):
            log.warning("%s", note)
        outcome = worker.refresher.refresh(
            fresh,
            initiated_by(fresh, reason),
            request_ids,
            record_no_data=reason is DueReason.REQUESTED,
            force=force,
        )
        report.refreshed.append(outcome)
    except Cancelled:
        raise
    except PgTrickleError as exc:
        log.error("refresh of %s failed: %s", st.display, exc)
        report.failed.append((st, str(exc)))
    except Exception as exc:
        if isinstance(exc, psycopg.Error) and (worker.conn.broken or worker.conn.closed):
            raise  # PostgreSQL is gone: the daemon reconnects
        log.exception("refresh of %s failed unexpectedly", st.display)
        report.failed.append((st, f"{type(exc).__name__}: {exc}"))
    finally:
        if not (worker.conn.broken or worker.conn.closed):
            worker.locks.unlock(st.pgt_id)
    return report


def refresh_group_locked(
    worker: Worker,
    group: RefreshGroup,
    members: Sequence[int],
    initiated_by: Callable[[StreamTable], str],
    requested: Mapping[int, Sequence[int]],
    force: bool = False,
    record_no_data: bool = False,
) -> list[RefreshOutcome]:
    """Refresh ``group`` (``members`` upstream first) under every member's advisory lock.

    Raises LockedElsewhere when another process holds one of the locks.
    """
    locked: list[int] = []
    try:
        for pgt_id in members:
            if not worker.locks.try_lock(pgt_id):
                raise LockedElsewhere(
                    f"atomic group {group.name}: a member is being refreshed by another process; try again"
                )
            locked.append(pgt_id)
        fresh = load_stream_tables(worker.conn)
        if any(m not in fresh for m in members):
            return []  # dropped meanwhile
        sts = {m: fresh[m] for m in members}
        return refresh_group(
            worker.refresher,
            group,
            members,
            sts,
            in_group_upstream(group_nodes(fresh), group),
            {m: initiated_by(sts[m]) for m in members},
            {m: list(requested.get(m, [])) for m in members},
            record_no_data=record_no_data,
            force=force,
        )
    finally:
        if not (worker.conn.broken or worker.conn.closed):
            for pgt_id in locked:
                worker.locks.unlock(pgt_id)


def refresh_group_unit(
    worker: Worker,
    group: RefreshGroup,
    members: Sequence[int],
    sts: Mapping[int, StreamTable],
    reasons: Mapping[int, DueReason | None],
    requested: Mapping[int, Sequence[int]],
    forced: frozenset[int] | set[int],
) -> TickReport:
    """One atomic group as a unit of a tick; a failure is reported on its last member."""
    report = TickReport()
    try:
        report.refreshed.extend(
            refresh_group_locked(
                worker,
                group,
                members,
                lambda st: initiated_by(st, reasons.get(st.pgt_id)),
                requested,
                force=any(m in forced for m in members),
                record_no_data=any(r is DueReason.REQUESTED for r in reasons.values()),
            )
        )
    except LockedElsewhere:
        pass
    except Cancelled:
        raise
    except Exception as exc:
        if isinstance(exc, psycopg.Error) and (worker.conn.broken or worker.conn.closed):
            raise
        if not isinstance(exc, PgTrickleError):
            log.exception("refresh of atomic group %s failed unexpectedly", group.name)
        else:
            log.error("%s", exc)
        report.failed.append((sts[members[-1]], str(exc)))
    return report


def refresh_batch_unit(
    worker: Worker,
    sts: Sequence[StreamTable],
    reasons: Mapping[int, DueReason],
    requested: Mapping[int, Sequence[int]],
    forced: frozenset[int] | set[int],
) -> TickReport:
    """Stream tables ready together refreshed as one batch (refresh/batch.py), each under its own
    advisory lock (one held elsewhere leaves that stream table for the next tick); a member's
    failure is reported for it alone."""
    report = TickReport()
    locked: list[int] = []
    try:
        for st in sts:
            if worker.locks.try_lock(st.pgt_id):
                locked.append(st.pgt_id)
            else:
                report.locked_elsewhere.append(st)
        if not locked:
            return report
        # Re-read under the locks: another process may have refreshed them meanwhile.
        fresh = load_stream_tables(worker.conn)
        requests = []
        for pgt_id in locked:
            now = fresh.get(pgt_id)
            if now is None:
                continue
            if note := stopped_note(now.display, now.status):
                log.warning("%s", note)
            requests.append(
                BatchRequest(
                    now,
                    initiated_by(now, reasons[pgt_id]),
                    list(requested.get(pgt_id, [])),
                    record_no_data=reasons[pgt_id] is DueReason.REQUESTED,
                    force=pgt_id in forced,
                )
            )
        for result in refresh_batch(worker.refresher, requests):
            if result.outcome is not None:
                report.refreshed.append(result.outcome)
            elif result.error is not None:
                log.error("refresh of %s failed: %s", result.st.display, result.error)
                report.failed.append((result.st, str(result.error)))
    except Cancelled:
        raise
    except Exception as exc:
        if isinstance(exc, psycopg.Error) and (worker.conn.broken or worker.conn.closed):
            raise  # PostgreSQL is gone: the daemon reconnects
        log.exception("batched refresh of %d stream tables failed unexpectedly", len(locked))
        done = {o.st.pgt_id for o in report.refreshed} | {st.pgt_id for st, _ in report.failed}
        report.failed.extend(
            (st, f"{type(exc).__name__}: {exc}")
            for st in sts
            if st.pgt_id in locked and st.pgt_id not in done
        )
    finally:
        if not (worker.conn.broken or worker.conn.closed):
            for pgt_id in locked:
                worker.locks.unlock(pgt_id)
    return report
