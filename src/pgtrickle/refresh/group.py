"""Refreshing an atomic group: one snapshot, one transaction, all members or none.

1. One coordinator transaction exports snapshot S; every member is planned
   at S (gates included). A member whose gate is closed (circuit breaker,
   watermark) or that is SUSPENDED / ERROR skips the whole group.
2. The members run upstream first inside one PostgreSQL transaction on the
   refresher's connection (each member's apply is a savepoint in it). A
   *root* member (no upstream member) refreshes in its own mode (FULL or
   DIFFERENTIAL) reading its sources at S. A member that reads another
   member refreshes DIFFERENTIAL when its own plan allows it: its change
   from the upstream member is what that member's apply wrote into its
   change buffer earlier in this transaction (refresh/group_changes.py),
   and the upstream member's contents are its stored rows at S with that
   change. Where this is not sound it is recomputed FULL, with the reason
   (refresh/group_plan.py: the upstream member refreshed FULL, it has
   upstream changes it has not taken yet, its query has no differential
   plan): it cannot read the upstream member's new contents from PostgreSQL
   (not committed yet), so Spark computes them in the same job from the
   upstream members' queries over their sources at S. What a member does is
   decided at S and again, at run time, with what its upstream members did.
3. Every member commits the frontier S plus the group's own transaction id,
   so a downstream member does not later take, as changes still to apply,
   what its upstream members wrote into their change buffers here.

A failure anywhere rolls back every member: each keeps its previous
contents and frontier. The failing member's failure is recorded (error
count, auto-suspension, alerts) and the others get a SKIPPED history row
naming it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import psycopg

from pgtrickle.catalog import identity
from pgtrickle.catalog.store import StreamTable
from pgtrickle.cdc.buffers import pending_changes
from pgtrickle.cdc.wal import wait_for_decoder
from pgtrickle.db.query import scalar
from pgtrickle.errors import PgTrickleError, RefreshError
from pgtrickle.gates.skips import record_skip
from pgtrickle.ops import health
from pgtrickle.ops.error_redaction import full_error, public_error
from pgtrickle.refresh import history
from pgtrickle.refresh.context import GroupContext
from pgtrickle.refresh.engine import Cancelled, Prepared, Refresher, RefreshOutcome
from pgtrickle.refresh.group_changes import GroupChanges
from pgtrickle.refresh.group_plan import (
    MemberInputs,
    MemberPlan,
    frontier_with_own_xid,
    member_action,
    member_actions,
)
from pgtrickle.refresh.plan import Action, RefreshPlan, differential_blocker
from pgtrickle.scheduler.groups import RefreshGroup

log = logging.getLogger(__name__)


def refresh_group(
    refresher: Refresher,
    group: RefreshGroup,
    order: Sequence[int],
    members: Mapping[int, StreamTable],
    in_group_upstream: Mapping[int, frozenset[int]],
    initiated_by: Mapping[int, str],
    request_ids: Mapping[int, Sequence[int]],
    record_no_data: bool = False,
    force: bool = False,
) -> list[RefreshOutcome]:
    """Refresh the members of ``group`` (``order``: upstream first) atomically.

    ``members`` must have been read under the members' advisory locks. ``record_no_data``
    says the refresh was asked for (a request, ``pgtrickle refresh``).
    Raises RefreshError when a member fails (nothing is applied then).
    """
    started = time.monotonic()
    refresher.clear_cancel()
    # An explicit request refreshes a SUSPENDED / ERROR stream table (and so its group); a schedule does not.
    stopped = (
        None
        if record_no_data or force
        else next((members[m] for m in order if members[m].status in ("SUSPENDED", "ERROR")), None)
    )
    if stopped is not None:
        reason = (
            f"atomic group {group.name}: member {stopped.display} is {stopped.status}; "
            "resume it, or take it out of the group"
        )
        return _skip_all(refresher, order, members, initiated_by, reason, request_ids, except_id=None)
    assert refresher.group is None, "atomic groups do not nest"
    # A new exported snapshot, shared by the members. It pins the sources read from PostgreSQL:
    # not the members themselves (a downstream member reads an upstream one's new contents from
    # this job, and the member's apply needs its table without our lock in the way).
    member_relids = {members[m].relid for m in order}
    external = list(
        {s.relid: s for m in order for s in members[m].sources if s.relid not in member_relids}.values()
    )
    coord, snap_id, snapshot, lsn = refresher.coordinator(external)
    try:
        if history.wal_capture_set_up(refresher.conn):
            wait_for_decoder(refresher.conn, refresher.dsn)
        prepared: dict[int, Prepared] = {}
        for pgt_id in order:
            st = members[pgt_id]
            try:
                prepared[pgt_id] = refresher.prepare(
                    st,
                    request_ids.get(pgt_id, ()),
                    initiated_by[pgt_id],
                    record_no_data,
                    force,
                    snapshot=snapshot,
                    defer_no_data=True,
                )
            except PgTrickleError as exc:
                _skip_all(
                    refresher,
                    order,
                    members,
                    initiated_by,
                    f"atomic group {group.name}: not refreshed because {st.display} failed: {exc}",
                    request_ids,
                    except_id=pgt_id,
                )
                raise RefreshError(f"atomic group {group.name}: {exc}; no member was changed") from exc
            plan, mark = prepared[pgt_id].plan, prepared[pgt_id].mark
            blocked = plan.reason if plan.action is Action.SKIP else None
            if blocked is None and mark is not None and mark.caps:
                blocked = "watermark hold_back cannot be honoured inside an atomic group (use 'gate')"
                record_skip(refresher.conn, st, initiated_by[pgt_id], blocked, plan.delta_rows or None, None)
            if blocked is not None:
                return _skip_all(
                    refresher,
                    order,
                    members,
                    initiated_by,
                    f"atomic group {group.name}: {st.display} skipped: {blocked}",
                    request_ids,
                    except_id=pgt_id,
                    skipped=st,
                )
        inputs = {
            m: _member_inputs(
                refresher, members, m, prepared[m], in_group_upstream.get(m, frozenset()), snapshot
            )
            for m in order
        }
        names = {m: members[m].display for m in order}
        planned = member_actions(order, in_group_upstream, inputs, names)
        if all(p.action is Action.NO_DATA for p in planned.values()):
            with refresher.conn.transaction():
                for pgt_id in order:
                    p = prepared[pgt_id]
                    refresher.gating.advance_no_data(
                        members[pgt_id],
                        p.plan,
                        p.mark,
                        snapshot,
                        request_ids.get(pgt_id, ()),
                        record_no_data,
                        initiated_by[pgt_id],
                    )
            return [RefreshOutcome(members[m], Action.NO_DATA, prepared[m].plan.reason) for m in order]
        ctx = GroupContext(
            group.name, coord, snap_id, snapshot, lsn, members, {members[m].relid: m for m in order}
        )
        return _run(
            refresher,
            ctx,
            group,
            order,
            _Decision(in_group_upstream, inputs, names),
            prepared,
            members,
            initiated_by,
            request_ids,
            record_no_data,
            started,
        )
    finally:
        coord.close()


def _run(
    refresher: Refresher,
    ctx: GroupContext,
    group: RefreshGroup,
    order: Sequence[int],
    decision: _Decision,
    prepared: Mapping[int, Prepared],
    members: Mapping[int, StreamTable],
    initiated_by: Mapping[int, str],
    request_ids: Mapping[int, Sequence[int]],
    record_no_data: bool,
    started: float,
) -> list[RefreshOutcome]:
    outcomes: list[RefreshOutcome] = []
    current = order[0]
    current_plan = prepared[current].plan
    refresher.progress(f"atomic group {group.name}: refreshing {len(order)} stream tables at one snapshot")
    try:
        with refresher.conn.transaction():
            xid = scalar(refresher.conn, "SELECT pg_current_xact_id()::text::bigint")
            ctx.commit_snapshot = frontier_with_own_xid(ctx.snapshot, int(xid))
            ctx.changes = GroupChanges(int(xid))
            refresher.group = ctx
            done: dict[int, Action] = {}
            for current in order:
                st, p = members[current], prepared[current]
                reqs = request_ids.get(current, ())
                # Decided again with what the upstream members did (one may have fallen back to FULL).
                ups = decision.upstream.get(current, frozenset())
                decided = member_action(decision.inputs[current], {u: done[u] for u in ups}, decision.names)
                if decided.action is Action.NO_DATA:
                    refresher.gating.advance_no_data(
                        st, p.plan, p.mark, ctx.commit_snapshot, reqs, record_no_data, initiated_by[current]
                    )
                    outcomes.append(RefreshOutcome(st, Action.NO_DATA, p.plan.reason))
                    done[current] = Action.NO_DATA
                    continue
                plan = current_plan = _member_plan(group, p.plan, decided)
                if decided.action is Action.DIFFERENTIAL and ups:
                    # Spark reads the upstream members' stored rows by name at S (refresh/delta_reads.py);
                    # the group's coordinator pins only the external sources, so pin them here, until
                    # the group commits (an applied one already is: commit.lock_for_apply).
                    pins = [identity.stream_table_pin(members[u]) for u in sorted(ups)]
                    identity.pin(refresher.conn, pins, identity.WRITE)
                st = replace(st, watermark_mark=p.mark)
                history_id = history.start_history(refresher.conn, st, plan, initiated_by[current])
                outcomes.append(refresher.execute(st, plan, history_id, reqs, p))
                done[current] = _for_readers(refresher, ctx, outcomes[-1])
    except Cancelled:
        raise
    except Exception as exc:
        message = public_error(exc)
        failed = members[current]
        log.error(
            "atomic group %s: %s failed, nothing applied: %s", group.name, failed.display, full_error(exc)
        )
        _record_member_failure(refresher, failed, current_plan, initiated_by[current], exc, message)
        _skip_all(
            refresher,
            order,
            members,
            initiated_by,
            f"atomic group {group.name}: not applied because {failed.display} failed: {message}",
            request_ids,
            except_id=current,
        )
        raise RefreshError(
            f"atomic group {group.name}: refresh of {failed.display} failed: {message}; no member was changed"
        ) from exc
    finally:
        try:
            if ctx.changes is not None:
                ctx.changes.drop(refresher.staging_conn)
        except psycopg.Error as exc:
            log.warning("atomic group %s: could not drop its staged changes: %s", group.name, exc)
        refresher.group = None
    elapsed = time.monotonic() - started
    for outcome in outcomes:
        outcome.seconds = elapsed
    return outcomes


@dataclass(frozen=True)
class _Decision:
    """What deciding a member's action at run time reads (refresh/group_plan.py)."""

    upstream: Mapping[int, frozenset[int]]
    inputs: Mapping[int, MemberInputs]
    names: Mapping[int, str]


def _member_inputs(
    refresher: Refresher,
    members: Mapping[int, StreamTable],
    pgt_id: int,
    prepared: Prepared,
    upstream: frozenset[int],
    snapshot: str,
) -> MemberInputs:
    """What the group's decision reads of member ``pgt_id``: its own plan, whether it could refresh
    differentially, and the rows of its upstream members' buffers it has not taken yet."""
    st, plan = members[pgt_id], prepared.plan
    if plan.action is Action.DIFFERENTIAL:
        blocker = None
    elif plan.action is Action.FULL:
        blocker = plan.reason
    else:
        blocker = differential_blocker(st.refresh_mode, prepared.mode)
    untaken: dict[int, int] = {}
    if upstream and st.frontier is not None:
        by_relid = {members[u].relid: u for u in upstream}
        sources = tuple(s for s in st.sources if s.relid in by_relid)
        for pending in pending_changes(refresher.conn, sources, st.frontier, snapshot):
            untaken[by_relid[pending.source.relid]] = pending.rows + int(pending.truncated)
    return MemberInputs(plan.action, blocker, untaken)


def _for_readers(refresher: Refresher, ctx: GroupContext, outcome: RefreshOutcome) -> Action:
    """What a member's refresh was for the members reading it: NO_DATA when a differential
    refresh wrote nothing into its change buffer (they have nothing to take from it)."""
    if outcome.action is not Action.DIFFERENTIAL or ctx.changes is None:
        return outcome.action
    relid = outcome.st.relid
    source = next((s for m in ctx.members.values() for s in m.sources if s.relid == relid), None)
    if source is None or ctx.changes.written(refresher.conn, source).rows:
        return outcome.action
    return Action.NO_DATA


def _member_plan(group: RefreshGroup, own: RefreshPlan, decided: MemberPlan) -> RefreshPlan:
    """The plan a member runs (and its history records) when the group decided ``decided``."""
    if decided.why is None:
        return own
    why = f"atomic group {group.name}: {decided.why}"
    if decided.action is own.action:
        why = f"{own.reason}; {why}"
    return RefreshPlan(decided.action, why, own.delta_rows, own.delta_deletes)


def _record_member_failure(
    refresher: Refresher,
    st: StreamTable,
    plan: RefreshPlan,
    initiated_by: str,
    exc: BaseException,
    message: str,
) -> None:
    cause = exc.__cause__ if isinstance(exc, RefreshError) and exc.__cause__ is not None else exc
    history_id = history.start_history(refresher.conn, st, plan, initiated_by)
    history.record_failure(refresher.conn, st, history_id, message, fatal=health.is_fatal(cause))


def _skip_all(
    refresher: Refresher,
    order: Sequence[int],
    members: Mapping[int, StreamTable],
    initiated_by: Mapping[int, str],
    reason: str,
    request_ids: Mapping[int, Sequence[int]],
    except_id: int | None,
    skipped: StreamTable | None = None,
) -> list[RefreshOutcome]:
    """A SKIPPED history row for every member but ``except_id`` (which recorded its own)."""
    outcomes = []
    for pgt_id in order:
        st = members[pgt_id]
        if pgt_id != except_id:
            record_skip(refresher.conn, st, initiated_by[pgt_id], reason, None, None)
        if skipped is not None and request_ids.get(pgt_id):
            refresher.conn.execute(
                "DELETE FROM pgtrickle.pgt_refresh_requests WHERE request_id = ANY(%s)",
                (list(request_ids[pgt_id]),),
            )
        outcomes.append(RefreshOutcome(st, Action.SKIP, reason))
    log.warning("%s", reason)
    return outcomes
