"""Refreshing stream tables now, on request (``pgtrickle refresh``), upstream first.

With ``keep_going`` (the command line) a stream table whose refresh fails
does not stop the others: every other one is still refreshed, in dependency
order, and one whose upstream failed in this run is skipped (it would only
read its upstream's old contents), saying which upstream. Without it
(:func:`refresh_sync`, the tests' helper) the first
failure is raised.

The decisions — which upstream blocks a stream table, the summary and the
exit status — are pure functions.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import psycopg

from pgtrickle.catalog.store import StreamTable, load_requests, load_stream_tables, upstream_ids
from pgtrickle.config import Settings
from pgtrickle.daemon.loop import LockedElsewhere, Scheduler, effective_groups, ordered
from pgtrickle.daemon.serving import Summary
from pgtrickle.db.redaction import scrub
from pgtrickle.errors import PgTrickleError
from pgtrickle.gates import watermark_gate
from pgtrickle.refresh.engine import Cancelled, RefreshOutcome
from pgtrickle.refresh.plan import Action
from pgtrickle.scheduler.policy import stopped_note


class Result(StrEnum):
    REFRESHED = "REFRESHED"
    """The refresh ran (FULL, DIFFERENTIAL) or found nothing to do (NO_DATA)."""
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"
    """Not refreshed: its upstream failed in this run, or a gate held it back (``--all``)."""


@dataclass(frozen=True)
class ManualRefresh:
    """What happened to one stream table in a manual refresh."""

    st: StreamTable
    result: Result
    reason: str
    outcome: RefreshOutcome | None = None
    error: PgTrickleError | Exception | None = None


def summarize(results: Iterable[ManualRefresh]) -> Summary:
    results = list(results)
    return Summary(
        sum(r.result is Result.REFRESHED for r in results),
        sum(r.result is Result.FAILED for r in results),
        sum(r.result is Result.SKIPPED for r in results),
    )


def blocked_by(
    members: Iterable[int], upstream: Mapping[int, Iterable[int]], not_done: Mapping[int, str]
) -> str | None:
    """Why a stream table (or an atomic group of ``members``) is skipped: an upstream outside it
    that failed or was skipped for that reason in this run (``not_done``: id → why), else None."""
    inside = set(members)
    for pgt_id in sorted(inside):
        for up in sorted(upstream.get(pgt_id, ())):
            if up not in inside and up in not_done:
                return not_done[up]
    return None


def _outcome_result(outcome: RefreshOutcome) -> ManualRefresh:
    result = Result.SKIPPED if outcome.action is Action.SKIP else Result.REFRESHED
    return ManualRefresh(outcome.st, result, outcome.reason, outcome)


def refresh_all(
    settings: Settings,
    dsn: str,
    names: Sequence[str] | None,
    *,
    progress: Callable[[str], None] | None = None,
    force: bool = False,
    keep_going: bool = True,
) -> list[ManualRefresh]:
    """Refresh the named stream tables (all when ``names`` is None) now, upstream first.

    A named stream table whose circuit breaker is open or whose watermark gate
    is closed refuses the whole command (unless ``force``), before anything runs.
    """
    scheduler = Scheduler(settings, dsn, progress=progress)
    try:
        ids: list[int] | None = None
        if names is not None:
            ids = []
            for name in names:
                row = scheduler.conn.execute("SELECT (pgtrickle._find_st(%s)).pgt_id", (name,)).fetchone()
                assert row is not None
                ids.append(int(row[0]))
        return refresh_on(scheduler, ids, force=force, keep_going=keep_going)
    finally:
        scheduler.close()


def refresh_on(
    scheduler: Scheduler, ids: Collection[int] | None, *, force: bool = False, keep_going: bool = True
) -> list[ManualRefresh]:
    """:func:`refresh_all` with ``scheduler``'s connections (and Spark): the stream tables ``ids``
    (all when None); a running daemon serves ``pgtrickle refresh`` with this (daemon/serve.py)."""
    conn = scheduler.conn
    sts = load_stream_tables(conn)
    if ids is None:
        wanted = set(sts)
    else:
        wanted = set(ids)
        if wanted - set(sts):
            raise PgTrickleError(
                "a stream table named in this refresh was dropped before it could be refreshed"
            )
    requested: dict[int, list[int]] = {}
    forced: set[int] = set()
    for req in load_requests(conn):
        requested.setdefault(req.pgt_id, []).append(req.request_id)
        if req.force:
            forced.add(req.pgt_id)
    if not force and ids is not None:
        _refuse_gated(conn, sts, wanted)
    ups = upstream_ids(sts)
    results: list[ManualRefresh] = []
    not_done: dict[int, str] = {}
    order = ordered(sts)
    group_of = {m: g for g in effective_groups(conn, sts) for m in g.members}

    def failed(members: Sequence[int], exc: Exception) -> None:
        if not keep_going:
            raise exc
        message = scrub(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        if not isinstance(exc, PgTrickleError):
            message = f"{type(exc).__name__}: {message}"
        for m in members:
            results.append(ManualRefresh(sts[m], Result.FAILED, message, error=exc))
            not_done[m] = f"upstream {sts[m].display} failed in this run"

    for position, pgt_id in enumerate(order):
        group = group_of.get(pgt_id)
        if group is not None:
            # A member asked for refreshes its whole atomic group, where its last member comes.
            if not group.members & wanted or any(m in group.members for m in order[position + 1 :]):
                continue
            members = [m for m in order if m in group.members]
        elif pgt_id in wanted:
            members = [pgt_id]
        else:
            continue
        why = blocked_by(members, ups, not_done)
        if why is not None:
            for m in members:
                results.append(ManualRefresh(sts[m], Result.SKIPPED, why))
                not_done[m] = f"upstream {sts[m].display} was skipped ({why})"
            continue
        try:
            if group is not None:
                outcomes = scheduler.refresh_group_locked(
                    group,
                    members,
                    lambda st: "INITIAL" if st.frontier is None else "MANUAL",
                    requested,
                    force=force or any(m in forced for m in members),
                    record_no_data=True,
                )
            else:
                outcomes = [
                    _refresh_one(
                        scheduler, pgt_id, sts, requested, force or pgt_id in forced, LockedElsewhere
                    )
                ]
        except Cancelled:
            raise
        except Exception as exc:
            failed(members, exc)
            continue
        results.extend(_outcome_result(o) for o in outcomes)
    return results


def _refresh_one(
    scheduler,
    pgt_id: int,
    sts: dict[int, StreamTable],
    requested: dict[int, list[int]],
    force: bool,
    locked_error: type[PgTrickleError],
) -> RefreshOutcome:
    if not scheduler.locks.try_lock(pgt_id):
        raise locked_error(
            f"stream table {sts[pgt_id].display} is being refreshed by another process; try again"
        )
    try:
        fresh = load_stream_tables(scheduler.conn, only=pgt_id)[pgt_id]
        if note := stopped_note(fresh.display, fresh.status):
            scheduler.progress(note)
        initiated_by = "INITIAL" if fresh.frontier is None else "MANUAL"
        return scheduler.refresher.refresh(
            fresh, initiated_by, requested.get(pgt_id, ()), record_no_data=True, force=force
        )
    finally:
        scheduler.locks.unlock(pgt_id)


def _refuse_gated(conn: psycopg.Connection, sts: dict[int, StreamTable], wanted: set[int]) -> None:
    """A named stream table whose circuit breaker is open, or whose watermark gate is closed."""
    open_ = conn.execute(
        "SELECT pgtrickle._display_name(pgt_schema, pgt_name), cb_trip_reason"
        " FROM pgtrickle.pgt_stream_tables WHERE cb_state = 'open' AND pgt_id = ANY(%s)"
        " ORDER BY pgt_id",
        (sorted(wanted),),
    ).fetchall()
    if open_:
        name, why = open_[0]
        raise PgTrickleError(
            f"the circuit breaker of stream table {name} is open ({why}); inspect it with "
            "pgtrickle.inspect_circuit_breaker, reset it with pgtrickle.reset_circuit_breaker, "
            "or refresh anyway with --force"
        )
    for pgt_id in sorted(wanted):
        gated = watermark_gate.gated_reason(conn, sts[pgt_id])
        if gated:
            raise PgTrickleError(
                f"stream table {sts[pgt_id].display} is held back by watermark gating ({gated}); "
                "pgtrickle watermarks shows which source lags; refresh anyway with --force"
            )


def _sqlstate(exc: BaseException | None) -> str | None:
    """The SQLSTATE of an error from PostgreSQL (psycopg) or Spark (``getSqlState()``), or of its cause."""
    for err in (exc, getattr(exc, "__cause__", None)):
        state = getattr(err, "sqlstate", None)
        get_sql_state = getattr(err, "getSqlState", None)
        if state is None and callable(get_sql_state):
            try:
                state = get_sql_state()
            except Exception:  # a Spark error without a JVM behind it any more
                state = None
        if isinstance(state, str) and state:
            return state
    return None


def _error(exc: BaseException | None, message: str) -> dict[str, Any]:
    sqlstate = _sqlstate(exc)
    return {
        "type": type(exc).__name__ if exc is not None else None,
        "sqlstate": sqlstate if isinstance(sqlstate, str) else None,
        "message": message,
    }


def results_document(results: Sequence[ManualRefresh]) -> dict[str, Any]:
    """Each stream table's outcome (upstream first) and the summary, as plain JSON values.

    ``pgtrickle refresh --json`` prints it (with ``schema_version``, cli/json_output.py) and its
    text table is drawn from it; a daemon serving the command stores exactly this, so both
    ways of refreshing print the same.
    """
    tables = []
    for r in results:
        o = r.outcome
        tables.append(
            {
                "name": r.st.display,
                "result": r.result.value,
                "action": o.action.value if o else None,
                "reason": scrub(r.reason),
                "rows_inserted": o.rows_inserted if o else None,
                "rows_deleted": o.rows_deleted if o else None,
                "seconds": round(o.seconds, 6) if o else None,
                "spark_jobs": o.spark_jobs if o else None,
                "error": _error(r.error, scrub(r.reason)) if r.result is Result.FAILED else None,
            }
        )
    summary = summarize(results)
    return {
        "stream_tables": tables,
        "summary": {
            "total": summary.refreshed + summary.failed + summary.skipped,
            "refreshed": summary.refreshed,
            "failed": summary.failed,
            "skipped": summary.skipped,
            "exit_code": summary.exit_code,
        },
    }


def refresh_sync(
    settings: Settings,
    dsn: str,
    names: Iterable[str] | None,
    *,
    progress: Callable[[str], None] | None = None,
    force: bool = False,
) -> list[RefreshOutcome]:
    """Refresh the named stream tables (all when ``names`` is None) now, upstream first.

    Raises on the first failure (``pgtrickle refresh`` goes on past failures:
    :func:`refresh_all`).
    """
    results = refresh_all(
        settings,
        dsn,
        None if names is None else list(names),
        progress=progress,
        force=force,
        keep_going=False,
    )
    return [r.outcome for r in results if r.outcome is not None]
