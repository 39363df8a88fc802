"""Planning a refresh through its gates; NO_DATA.

:meth:`Gating.plan_and_maybe_skip` counts the changes pending between the frontier and a
snapshot (with WAL capture, once the decoder has passed it), asks the pure
:func:`pgtrickle.refresh.plan.plan_refresh` (or, for a ``hold_back`` watermark gate, plans the
capped sources' refresh here), and passes the gates: a closed watermark gate or an open circuit
breaker (:mod:`pgtrickle.gates`) turns the plan into SKIP, recorded, and its refresh requests
are consumed. With nothing to apply the frontier moves to the snapshot at once
(:meth:`Gating.advance_no_data`, ``NO_DATA``; an atomic group does that in its own transaction).

It uses the refresher only through :class:`~pgtrickle.refresh.context.RefreshContext`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import psycopg
from psycopg.types.json import Jsonb

from pgtrickle.catalog.store import StreamTable
from pgtrickle.cdc.buffers import pending_changes
from pgtrickle.cdc.wal import wait_for_decoder
from pgtrickle.db.query import scalar
from pgtrickle.gates import breaker_gate, watermark_gate
from pgtrickle.gates.skips import record_skip
from pgtrickle.gates.watermark_gate import WatermarkMark
from pgtrickle.refresh import history
from pgtrickle.refresh.context import RefreshContext
from pgtrickle.refresh.modes import mode_figures
from pgtrickle.refresh.plan import Action, ModeContext, RefreshPlan, plan_refresh, reinit_text


class Gating:
    """The gates and NO_DATA of one refresher (used by the engine and by atomic groups through it)."""

    def __init__(self, refresher: RefreshContext) -> None:
        self.r = refresher

    @property
    def conn(self) -> psycopg.Connection:
        """The refresher's catalog connection (a new one after a reconnect)."""
        return self.r.conn

    def plan_and_maybe_skip(
        self,
        st: StreamTable,
        request_ids: Sequence[int],
        initiated_by: str,
        record_no_data: bool,
        force: bool = False,
        mode: ModeContext | None = None,
        snapshot: str | None = None,
        defer_no_data: bool = False,
    ) -> tuple[RefreshPlan, WatermarkMark | None]:
        """Plan the refresh at ``snapshot`` (default: now), passing the gates.

        A NO_DATA plan moves the frontier at once, unless ``defer_no_data``
        (an atomic group does it in its own transaction, with
        :meth:`advance_no_data`; the mark returned is then ``None`` when the
        effective watermark must be kept).
        """
        mode = mode or ModeContext()
        check = watermark_gate.evaluate(self.conn, st)
        mark = check.mark if check else None
        if st.frontier is None and (check is None or not (check.blocked or check.hold_back)):
            return plan_refresh(st.refresh_mode, None, st.needs_reinit, None, mode), mark
        if snapshot is None:
            snapshot = scalar(self.conn, "SELECT pg_current_snapshot()::text")
            if any(s.kind == "TABLE" for s in st.sources) and history.wal_capture_set_up(self.conn):
                wait_for_decoder(self.conn, self.r.dsn)
        with self.conn.transaction():
            blocked = check.blocked if check else None
            hold_back = check is not None and check.hold_back
            if check is not None and blocked and force:
                blocked = None
                if check.mode == "hold_back":
                    # Forced: read every source as it is now (and leave any earlier hold-back behind).
                    mark = WatermarkMark(None, None)
                    check = replace(check, mark=mark)
            if hold_back and not blocked:
                assert check is not None
                window = watermark_gate.hold_back_window(self.conn, st, check, snapshot)
                if window.skip_reason and force:
                    mark = WatermarkMark(None, None)
                    check = replace(check, mark=mark)
                    window = watermark_gate.hold_back_window(self.conn, st, check, snapshot)
                blocked = window.skip_reason
                pending = window.pending
            elif st.frontier is not None:
                pending = pending_changes(self.conn, st.sources, st.frontier, snapshot)
            else:
                pending = []
            if hold_back:
                assert check is not None
                plan = self._hold_back_plan(st, pending, check.reason)
            elif st.frontier is None:
                plan = plan_refresh(st.refresh_mode, None, st.needs_reinit, None, mode)
            else:
                if mode.differential and any(p.rows for p in pending):
                    source_rows, ratio = mode_figures(self.conn, st, sum(p.rows for p in pending))
                    mode = replace(mode, source_rows=source_rows, fallback_ratio=ratio)
                plan = plan_refresh(
                    st.refresh_mode,
                    st.frontier,
                    st.needs_reinit,
                    pending,
                    mode,
                    reinit_reason=st.reinit_reason,
                )
            # A closed gate skips (with nothing to apply, a gated stream table just moves its frontier).
            # (In a group a member may be recomputed for its upstream members' changes: a closed gate skips.)
            if blocked and (plan.action is not Action.NO_DATA or hold_back or defer_no_data):
                record_skip(
                    self.conn, st, initiated_by, blocked, plan.delta_rows or None, plan.delta_deletes or None
                )
                if request_ids:
                    self.conn.execute(
                        "DELETE FROM pgtrickle.pgt_refresh_requests WHERE request_id = ANY(%s)",
                        (list(request_ids),),
                    )
                return RefreshPlan(Action.SKIP, blocked, plan.delta_rows, plan.delta_deletes), None
            if st.frontier is None:
                return plan, mark
            if plan.action is not Action.NO_DATA and not force:
                gate = breaker_gate.check(self.conn, st, pending, st.frontier, snapshot, initiated_by)
                if gate.blocked:
                    if request_ids:
                        self.conn.execute(
                            "DELETE FROM pgtrickle.pgt_refresh_requests WHERE request_id = ANY(%s)",
                            (list(request_ids),),
                        )
                    return RefreshPlan(Action.SKIP, gate.reason, plan.delta_rows, plan.delta_deletes), None
            if plan.action is Action.NO_DATA:
                # A closed gate with nothing to apply keeps the effective watermark it had.
                if defer_no_data:
                    return plan, None if blocked else mark
                self.advance_no_data(
                    st, plan, None if blocked else mark, snapshot, request_ids, record_no_data, initiated_by
                )
        return plan, mark

    def advance_no_data(
        self,
        st: StreamTable,
        plan: RefreshPlan,
        mark: WatermarkMark | None,
        snapshot: str,
        request_ids: Sequence[int],
        record_no_data: bool,
        initiated_by: str,
    ) -> bool:
        """Nothing to apply: move the frontier to ``snapshot`` (``mark`` None keeps the effective
        watermark). Returns False when the frontier moved meanwhile (nothing done)."""
        keep = mark is None
        cur = self.conn.execute(
            """
            UPDATE pgtrickle.pgt_stream_tables
               SET frontier = %(s)s::pg_snapshot, frontier_lsn = pg_current_wal_lsn(),
                   data_timestamp = now(), last_refresh_at = now(), last_attempt_at = now(),
                   status = CASE WHEN status = 'INITIALIZING' THEN 'ACTIVE' ELSE status END,
                   effective_watermark = CASE WHEN %(keep)s THEN effective_watermark ELSE %(ew)s END,
                   watermark_positions = CASE WHEN %(keep)s THEN watermark_positions ELSE %(pos)s END
             WHERE pgt_id = %(id)s AND frontier::text = %(f)s
            """,
            {
                "s": snapshot,
                "id": st.pgt_id,
                "f": st.frontier,
                "keep": keep,
                "ew": mark.effective_watermark if mark else None,
                "pos": Jsonb(mark.positions) if mark and mark.positions else None,
            },
        )
        if cur.rowcount and request_ids:
            self.conn.execute(
                "DELETE FROM pgtrickle.pgt_refresh_requests WHERE request_id = ANY(%s)", (list(request_ids),)
            )
        if cur.rowcount and record_no_data:
            self.conn.execute(
                """
                INSERT INTO pgtrickle.pgt_refresh_history
                    (pgt_id, action, status, initiated_by, rows_inserted, rows_deleted,
                     delta_row_count, end_time, mode_reason, frontier, effective_watermark)
                VALUES (%s, 'NO_DATA', 'COMPLETED', %s, 0, 0, 0, clock_timestamp(), %s, %s::pg_snapshot, %s)
                """,
                (st.pgt_id, initiated_by, plan.reason, snapshot, mark.effective_watermark if mark else None),
            )
        return bool(cur.rowcount)

    @staticmethod
    def _hold_back_plan(st: StreamTable, pending: Sequence, reason: str) -> RefreshPlan:
        """A hold_back refresh reads capped sources as of their caps: FULL (the differential path
        reads every source at the refresh snapshot and cannot), or nothing when nothing moved."""
        delta = sum(p.rows for p in pending)
        deletes = sum(p.deletes for p in pending)
        if st.frontier is None:
            return RefreshPlan(Action.FULL, f"initial population; {reason}", 0)
        if st.needs_reinit:
            return RefreshPlan(Action.FULL, f"{reinit_text(st.reinit_reason)}; {reason}", delta, deletes)
        if delta == 0 and not any(p.truncated for p in pending) and not st.reads_clock:
            return RefreshPlan(Action.NO_DATA, "no pending changes up to the watermark", 0)
        return RefreshPlan(Action.FULL, reason, delta, deletes)
