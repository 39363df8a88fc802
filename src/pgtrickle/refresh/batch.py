"""A batch of refreshes: one snapshot, one Spark job for every member's delta, one transaction each.

The stream tables of a batch are chosen by :mod:`pgtrickle.scheduler.batches` (units ready
together) and ``daemon/workers._followers`` (due units downstream of them). :func:`refresh_batch`
refreshes them (their advisory locks held by the caller), in dependency order:

1. One coordinator transaction exports snapshot S and pins every member's sources.
2. Each member is planned at S through its own gates, as a lone refresh is
   (:meth:`Refresher.prepare`): a tripped circuit breaker, a closed watermark gate, a
   suspended table skip it with their usual history; with nothing pending its frontier moves to
   S (NO_DATA); a failure while planning is recorded for it. A member whose plan is not a
   DIFFERENTIAL one without hidden state tables (:func:`~pgtrickle.scheduler.batches.member_why_alone`)
   refreshes on its own after the batch, exactly as it would alone.
3. Every other member gets its RUNNING history row, its reads registered as Spark views and its
   delta as Spark SQL (:meth:`DifferentialRun.delta_text`; a member that cannot be planned so
   refreshes on its own after the batch). Members share their reads
   (:class:`~pgtrickle.refresh.delta_reads.SharedReads`): the stream tables of a fan read one
   change buffer over one window, so one JDBC relation, persisted, serves them all. The deltas
   are unioned in ONE query, each row tagged with its member's pgt_id (``__pgt_member``) and its
   values in a struct column (the others NULL) that only members of the same Spark types share
   (:mod:`pgtrickle.refresh.union_types`), so every value keeps its Spark type; the union is
   consolidated at once (grouped by member and row, weights summed,
   zero sums dropped) - one shuffle for the batch, not one per member. ONE action collects it (up
   to :data:`COPY_MAX_ROWS` rows; a larger union is written by one partitioned JDBC write into
   one staging table, from which each member gets a staging table of its own rows).
4. Each member's rows are applied in its own PostgreSQL transaction with its own frontier (S),
   change-buffer record and history row (:meth:`DifferentialRun.apply_rows`). A member whose
   apply fails is recorded as failed (error count, alerts) and keeps its contents; a delta that
   does not match its table makes it refresh FULL; the other members commit.

A member reading another member is *chained* to it (:mod:`pgtrickle.refresh.chained`): computed
from that member's delta in the same job, its gates passed after that member's apply, at the
batch's snapshot with that apply made visible, which it commits as its frontier. One that cannot
be (its plan or a column does not allow it, or its upstream member did not apply exactly what the
job computed) refreshes on its own after that member, from its change buffer.

If the shared job fails, nothing was applied: every member is refreshed one by one on its own
(a member's bad value then fails only that member), and the log says so.

Spark jobs: every member's history row carries ``batch_id``, the refresh_id of the batch's
first member's row, which records the shared job(s); the other members record 0 jobs and
``spark_jobs_why`` names the refresh holding them. So summing ``spark_jobs`` counts each job once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from psycopg import sql

from pgtrickle import faults
from pgtrickle.catalog.store import StreamTable
from pgtrickle.cdc.buffers import PendingChanges
from pgtrickle.cdc.wal import wait_for_decoder
from pgtrickle.db.columns import column_types
from pgtrickle.dvm import ir
from pgtrickle.dvm.layout import ROW_ID
from pgtrickle.errors import PgTrickleError, RefreshError
from pgtrickle.refresh import history, union_types
from pgtrickle.refresh.chained import chained_frontier
from pgtrickle.refresh.delta_apply import Staged
from pgtrickle.refresh.delta_reads import DeltaReads, Window
from pgtrickle.refresh.differential import COPY_MAX_ROWS, DifferentialRun
from pgtrickle.refresh.engine import Cancelled, Prepared, Refresher, RefreshOutcome
from pgtrickle.refresh.plan import Action
from pgtrickle.refresh.read_names import FallbackToFull, NotChained
from pgtrickle.refresh.shared_reads import SharedReads
from pgtrickle.refresh.spark_job import ROWS_READ_WHOLE, code_generation, compiles, shuffle_sized
from pgtrickle.refresh.tagged import MEMBER, shared_slots, split_rows, union_sql
from pgtrickle.scheduler.batches import member_why_alone
from pgtrickle.spark import carry, jdbc, jobs, planning
from pgtrickle.spark.capabilities import tag_jobs
from pgtrickle.sql.ident import quote_ident

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchRequest:
    """One member of a batch, as its lone refresh would be asked for."""

    st: StreamTable
    initiated_by: str
    request_ids: Sequence[int] = ()
    record_no_data: bool = False
    force: bool = False


@dataclass
class BatchResult:
    """What became of one member: its outcome, or the error it failed with (recorded already)."""

    st: StreamTable
    outcome: RefreshOutcome | None = None
    error: Exception | None = None


@dataclass
class _Member:
    request: BatchRequest
    prepared: Prepared | None
    """``None`` for a chained member until its gates are passed after its upstream members' applies."""
    history_id: int | None
    run: DifferentialRun
    plan: Any = None
    """The member's delta plan (:meth:`DifferentialRun.batch_plan`)."""
    text: str | None = None
    """The member's delta (Spark SQL: c0.., weight, row id), not yet consolidated."""
    reads: DeltaReads | None = None
    delta_rows: int = 0
    rows: list[tuple] | Staged | None = None
    alone: bool = False
    """Dropped out of the shared job: refreshed on its own after it."""
    feeders: list[_Member] = field(default_factory=list)
    """Upstream members it reads: it is computed from their deltas in the same job (chained)."""
    feeds: bool = False
    """A chained member reads its delta."""
    applied: bool = False
    """Its apply committed the delta the job computed (what its chained members took)."""
    depth: int = 0
    """0, or 1 + the greatest depth of its feeders: framed after them."""

    @property
    def st(self) -> StreamTable:
        return self.run.st


def refresh_batch(refresher: Refresher, requests: Sequence[BatchRequest]) -> list[BatchResult]:
    """Refresh ``requests`` as one batch (see the module docstring); one result per member, in order."""
    refresher.clear_cancel()
    batch = _Batch(refresher, requests)
    with jobs.counting("pgtrickle-batch", f"batch of {len(requests)} stream tables"):
        batch.compute()
        shared = jobs.figures()
    note = batch.shared.note()
    if note is not None:
        shared = replace(shared, why="; ".join(w for w in (shared.why, note) if w))
    batch.finish(shared)
    return [batch.results[r.st.pgt_id] for r in requests]


class _Batch:
    def __init__(self, refresher: Refresher, requests: Sequence[BatchRequest]) -> None:
        self.r = refresher
        self.requests = requests
        self.results = {r.st.pgt_id: BatchResult(r.st) for r in requests}
        self.members: list[_Member] = []
        self.alone: list[tuple[BatchRequest, Prepared | None]] = []
        """Members planned FULL, or keeping hidden state tables: refreshed as they are alone; with
        ``None``, planned then (they read one of these, or could not be chained to a member)."""
        self.snapshot = self.lsn = ""
        self.spark_seconds = 0.0
        self.started = time.monotonic()
        self.lead_recorded = False
        """The first member's own row recorded the shared job's figures (its apply ran, or failed)."""
        self.failed: Exception | None = None
        """The shared job's failure (the members then refresh one by one)."""
        self.shared = SharedReads()

    # ------------------------------------------------------------ steps 1-3
    def compute(self) -> None:
        sources = list({s.relid: s for r in self.requests for s in r.st.sources}.values())
        coord, snap_id, self.snapshot, self.lsn = self.r.coordinator(sources)
        with coord:
            try:
                if history.wal_capture_set_up(self.r.conn):
                    wait_for_decoder(self.r.conn, self.r.dsn)
                for request in self.requests:
                    self._plan(request)
                if self.members:
                    history.set_batch(self.r.conn, [m.history_id for m in self.members if m.history_id])
                for m in self.members:
                    self._plan_delta(m)
                for m in self.members:
                    if m.plan is not None:
                        assert m.st.frontier is not None
                        self.shared.widen(m.plan.read_columns)
                        for source in m.st.sources:
                            self.shared.add_window(source.relid, m.st.frontier)
                # Level by level (a chained member after the members it reads): the reads a level
                # shares are persisted before its deltas read by chained members become leaves.
                # Planned as the job runs (a leaf is planned when made): AQE off for a small delta.
                changes = sum(m.delta_rows for m in self.members if m.plan is not None)
                with code_generation(self.r.spark) as codegen:
                    with shuffle_sized(self.r.spark, changes):
                        for depth in sorted({m.depth for m in self.members}):
                            level = [m for m in self.members if m.depth == depth]
                            for m in level:
                                assert m.st.frontier is not None
                                if m.plan is not None:
                                    self._frame(m, Window(m.st.frontier, self.snapshot, snap_id, coord))
                            codegen(self._compiles(changes))  # before the shared reads' plans are made
                            self.shared.persist_shared()
                            for m in level:
                                if m.feeds and m.text is not None:
                                    self._feed(m)
                    live = [m for m in self.members if m.text is not None]
                    t0 = time.monotonic()
                    if live:
                        codegen(self._compiles(changes))
                        faults.point("refresh.spark_job")
                        try:
                            with carry.refusals_checked(lambda: self.r.spark, coord):
                                self._shared_job(live)
                        except Cancelled:
                            raise
                        except Exception as exc:
                            self.failed = exc
                            log.warning(
                                "batch of %d stream tables: the shared Spark job failed (%s); "
                                "refreshing its members one by one",
                                len(live),
                                (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300],
                            )
                    self.spark_seconds = time.monotonic() - t0
            except Cancelled:
                self._abandon()
                raise
            finally:
                for m in self.members:
                    if m.reads is not None:
                        m.reads.release()
                self.shared.release()
                coord.rollback()

    def _compiles(self, changes: int) -> bool:
        """Whether the plans planned next get whole-stage code generation: not when the batch's
        delta is small and the members framed so far read few rows whole (spark_job.compiles)."""
        whole = sum(m.run.timings.get(ROWS_READ_WHOLE, 0) for m in self.members if m.text is not None)
        return compiles(changes, whole)

    def _abandon(self) -> None:
        for m in self.members:
            if m.history_id is not None:
                history.record_abandoned(self.r.conn, m.history_id)

    def _plan(self, request: BatchRequest) -> None:
        """Plan one member at the batch's snapshot through its gates (step 2); one reading another
        member is chained to it (refresh/chained.py) or refreshed on its own after it."""
        reads = {s.relid for s in request.st.sources}
        if any(r.st.relid in reads for r, _ in self.alone):
            self.alone.append((request, None))
            return
        feeders = [m for m in self.members if m.st.relid in reads]
        if feeders:
            self._plan_chained(request, feeders)
            return
        try:
            prepared = self._prepare(request, self.snapshot)
        except PgTrickleError as exc:  # recorded by prepare
            self.results[request.st.pgt_id].error = exc
            return
        plan = prepared.plan
        if plan.action in (Action.NO_DATA, Action.SKIP):
            self.results[request.st.pgt_id].outcome = RefreshOutcome(request.st, plan.action, plan.reason)
            return
        why = member_why_alone(plan.action is Action.DIFFERENTIAL, len(prepared.layout.state_tables))
        if why is not None:
            log.debug("%s refreshes on its own: %s", request.st.display, why)
            self.alone.append((request, prepared))
            return
        st = replace(request.st, watermark_mark=prepared.mark)  # committed with the frontier
        history_id = history.start_history(self.r.conn, st, plan, request.initiated_by)
        run = DifferentialRun(self.r, st, prepared.analysis, prepared.layout)
        self.members.append(_Member(request, prepared, history_id, run))

    def _prepare(self, request: BatchRequest, snapshot: str) -> Prepared:
        """``request`` planned at ``snapshot`` through its gates (a failure recorded and raised)."""
        return self.r.prepare(
            request.st,
            request.request_ids,
            request.initiated_by,
            request.record_no_data,
            request.force,
            snapshot=snapshot,
        )

    def _plan_chained(self, request: BatchRequest, feeders: list[_Member]) -> None:
        """A member reading upstream members: chained to them when its refresh is a DIFFERENTIAL
        one without hidden state tables and theirs write their buffers as computed. Its gates are
        passed after their applies (:meth:`_chained`); nothing is recorded for it here."""
        st = request.st
        why = None
        if any(f.run.layout.stored is not None for f in feeders):
            why = "an upstream member keeps its aggregate's state (PostgreSQL writes its changes)"
        elif st.frontier is None or st.needs_reinit or st.reads_clock or not self.r.analysis(st).differential:
            why = "its refresh is not DIFFERENTIAL"
        else:
            try:
                analysis, differential, layout, changed = self.r.modes.prepare(st, request.initiated_by)
            except Exception as exc:  # its own refresh meets it again, and records it
                why = f"preparing it failed: {exc}"
            else:
                if not differential or changed or layout.state_tables:
                    why = "its refresh is not a DIFFERENTIAL one without hidden state tables"
        if why is not None:
            log.debug("%s refreshes on its own after its upstream members: %s", st.display, why)
            self.alone.append((request, None))
            return
        for f in feeders:
            f.feeds = True
            f.run.report_xid = True
        run = DifferentialRun(self.r, st, analysis, layout)
        depth = 1 + max(f.depth for f in feeders)
        self.members.append(_Member(request, None, None, run, feeders=feeders, depth=depth))

    def _plan_delta(self, m: _Member) -> None:
        """A member's delta plan for its pending changes (a chained member's include its upstream
        members' deltas in the job); on a failure it drops out."""
        try:
            changed = m.run.changes(self.snapshot)
            for f in m.feeders:
                if f.alone:
                    raise NotChained(f"upstream member {f.st.display} refreshes on its own")
                if f.plan is not None:
                    source = next(s for s in m.st.sources if s.relid == f.st.relid)
                    if source.relid not in m.run.pending_sources:
                        # Truly empty, not only left out for this member (unread updates): the
                        # window is shared by every member at this frontier.
                        assert m.st.frontier is not None
                        self.shared.nothing_pending(source.relid, m.st.frontier)
                    known = changed.get(source.relid, PendingChanges(source, 0, 0, 0, False))
                    changed[source.relid] = replace(known, inserts=known.inserts + max(f.delta_rows, 1))
            m.delta_rows = sum(p.rows for p in changed.values())
            m.plan = m.run.batch_plan(changed) if changed else None
            if m.plan is None:
                m.rows = []
        except Cancelled:
            raise
        except Exception as exc:
            self._drop_out(m, exc)

    def _frame(self, m: _Member, window: Window) -> None:
        """A member's delta as Spark SQL over its registered reads; on a failure it drops out."""
        try:
            for f in m.feeders:
                if f.alone or (f.plan is not None and f.st.relid not in self.shared.fed):
                    raise NotChained(f"upstream member {f.st.display} dropped out of the shared job")
            m.text, m.reads = m.run.delta_text(window, m.plan, self.shared)
        except Cancelled:
            raise
        except Exception as exc:
            self._drop_out(m, exc)

    def _feed(self, m: _Member) -> None:
        """A member chained members read: its delta made a leaf they share; on a failure it drops out."""
        assert m.reads is not None
        try:
            m.text = m.run.fed_text(m.plan, m.reads, self.shared)
        except Cancelled:
            raise
        except Exception as exc:
            m.text = None
            self._drop_out(m, exc)

    @staticmethod
    def _drop_out(m: _Member, exc: Exception) -> None:
        # Whatever it was, this member refreshes on its own after the batch, where the error (or
        # its fallback to FULL) is met exactly as in a lone refresh.
        log.info("%s: refreshed on its own after the batch (%s)", m.st.display, exc)
        m.plan = None
        m.alone = True

    def _shared_job(self, live: Sequence[_Member]) -> None:
        """The members' deltas in one query, consolidated at once, collected by one action (staged
        when large)."""
        spark = self.r.spark
        tag_jobs(spark, "pgtrickle-batch", f"batch of {len(live)} stream tables")
        widths = [len(m.run.layout.columns) for m in live]
        changes = sum(m.delta_rows for m in live)
        timings: dict[str, float] = {}
        texts = [m.text or "" for m in live]
        keys = [union_types.key(spark, text, m.st.sources) for m, text in zip(live, texts, strict=True)]
        types = union_types.known(keys)
        slots = shared_slots(types)
        ids = [m.st.pgt_id for m in live]
        union = planning.sql(spark, union_sql(ids, widths, texts, changes, slots), timings, "batch")
        union_types.learn(union, keys, slots, types)
        with shuffle_sized(spark, changes, one_round=True):
            rows = planning.planned(union.limit(COPY_MAX_ROWS + 1), timings, "batch").collect()
            if len(rows) > COPY_MAX_ROWS:
                del rows
                self._stage(union, live, widths, slots)
                return
        by_member = split_rows(rows, ids, slots)
        for m in live:
            m.rows = by_member[m.st.pgt_id]

    def _stage(
        self, union: Any, live: Sequence[_Member], widths: Sequence[int], slots: Sequence[int]
    ) -> None:
        """A large union: one JDBC write into one staging table, split into one per member in PostgreSQL."""
        conn = self.r.conn
        name = f"batch_{self._lead()}"
        wide = sql.SQL("pgtrickle_changes.{}").format(sql.Identifier(name))
        cols: list[sql.Composable] = [sql.SQL("{} bigint").format(sql.Identifier(MEMBER))]
        for i, m in enumerate(live):
            stored = column_types(conn, m.st.relid)
            for j, column in enumerate(m.run.layout.columns[: widths[i]]):
                cols.append(
                    sql.SQL("{} {}").format(
                        sql.Identifier(f"m{i}_c{j}"), sql.SQL(stored.get(column, "bigint"))
                    )
                )
        cols += [sql.SQL("{} bigint").format(sql.Identifier(c)) for c in (ir.WEIGHT, ROW_ID)]
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(wide))
        conn.execute(sql.SQL("CREATE UNLOGGED TABLE {} ({})").format(wide, sql.SQL(", ").join(cols)))
        try:
            self.r.progress(f"batch of {len(live)}: large delta: writing it by JDBC into a staging table")
            flat = [
                MEMBER,
                *(_flat(i, j, m.st.pgt_id, slots) for i, m in enumerate(live) for j in range(widths[i])),
            ]
            jdbc.write_append(
                union.selectExpr(*flat, ir.WEIGHT, ROW_ID), self.r.target, f'pgtrickle_changes."{name}"'
            )
            for i, m in enumerate(live):
                own = [f"m{i}_c{j}" for j in range(widths[i])] + [ir.WEIGHT, ROW_ID]
                table = f"delta_{m.st.pgt_id}"
                conn.execute(
                    sql.SQL(
                        "DROP TABLE IF EXISTS pgtrickle_changes.{t}; CREATE UNLOGGED TABLE "
                        "pgtrickle_changes.{t} AS SELECT {c} FROM {w} WHERE {m} = {id}"
                    ).format(
                        t=sql.Identifier(table),
                        c=sql.SQL(", ").join(map(sql.Identifier, own)),
                        w=wide,
                        m=sql.Identifier(MEMBER),
                        id=sql.Literal(m.st.pgt_id),
                    )
                )
                m.rows = Staged(f"pgtrickle_changes.{quote_ident(table)}", own)
        finally:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(wide))

    # ------------------------------------------------------------ step 4
    def _lead(self) -> int | None:
        """The history row of the first member (never a chained one): it records the shared job."""
        return self.members[0].history_id if self.members else None

    def finish(self, shared: jobs.JobFigures) -> None:
        try:
            self.r.check_cancel()
        except Cancelled:
            self._abandon()
            raise
        lead = self._lead()
        for m in self.members:
            if m.prepared is None:
                result = self._chained(m, lead, shared)
            elif self.failed is not None or m.alone or m.rows is None:
                result = self._own(m.request, m.prepared, m.history_id)
            else:
                result = self._apply(m, lead, shared)
            self.results[m.st.pgt_id] = result
        if lead is not None and not self.lead_recorded:
            history.record_batch_jobs(self.r.conn, lead, len(self.members), shared, self.failed is not None)
        for request, prepared in self.alone:
            self.results[request.st.pgt_id] = (
                self._lone(request) if prepared is None else self._own(request, prepared, None)
            )

    def _chained(self, m: _Member, lead: int | None, shared: jobs.JobFigures) -> BatchResult:
        """A chained member, once its upstream members applied: its gates passed at the batch's
        snapshot with their apply transactions made visible (refresh/chained.py), then its rows
        applied with that frontier - or, when they did not all apply exactly what the job
        computed, refreshed on its own from their change buffers."""
        request = m.request
        if self.failed is not None or m.alone or m.rows is None or not all(f.applied for f in m.feeders):
            return self._lone(request)
        try:
            snapshot = chained_frontier(self.snapshot, [f.run.xid for f in m.feeders])
        except RefreshError as exc:
            log.info("%s: refreshed on its own after the batch (%s)", m.st.display, exc)
            return self._lone(request)
        try:
            prepared = self._prepare(request, snapshot)
        except PgTrickleError as exc:  # recorded by prepare
            return BatchResult(request.st, error=exc)
        plan = prepared.plan
        if plan.action in (Action.NO_DATA, Action.SKIP):
            return BatchResult(request.st, RefreshOutcome(request.st, plan.action, plan.reason))
        if member_why_alone(plan.action is Action.DIFFERENTIAL, len(prepared.layout.state_tables)):
            return self._own(request, prepared, None)
        st = replace(request.st, watermark_mark=prepared.mark)  # committed with the frontier
        m.run.st = st
        m.prepared = prepared
        m.delta_rows = plan.delta_rows  # counted at that snapshot: its upstream members' rows included
        m.history_id = history.start_history(self.r.conn, st, plan, request.initiated_by)
        if lead is not None:
            history.set_batch(self.r.conn, [lead, m.history_id])
        return self._apply(m, lead, shared, snapshot)

    def _lone(self, request: BatchRequest) -> BatchResult:
        """A member refreshed exactly as it would be alone, planned now (after the batch's applies)."""
        result = BatchResult(request.st)
        try:
            result.outcome = self.r.refresh(
                request.st, request.initiated_by, request.request_ids, request.record_no_data, request.force
            )
        except Cancelled:
            raise
        except Exception as exc:  # recorded by the refresh
            result.error = exc
        return result

    def _apply(
        self, m: _Member, lead: int | None, shared: jobs.JobFigures, snapshot: str | None = None
    ) -> BatchResult:
        """One member's own transaction; the first member's row records the shared job's figures."""
        result = BatchResult(m.st)
        if lead is not None and m.history_id == lead:
            figures = replace(shared, why=history.batch_jobs_why(lead, len(self.members), shared))
        else:
            figures = jobs.JobFigures(
                0, 0, f"computed by the shared Spark job of batch {lead}, recorded there"
            )
        assert m.rows is not None and m.prepared is not None and m.history_id is not None
        try:
            with jobs.attributed(figures, f"refresh {m.st.display}"):
                inserted, deleted = m.run.apply_rows(
                    m.rows,
                    m.history_id,
                    snapshot or self.snapshot,
                    self.lsn,
                    m.request.request_ids,
                    self.spark_seconds,
                )
                result.outcome = self.r.differential_outcome(
                    m.st,
                    m.prepared.plan,
                    m.history_id,
                    m.run,
                    inserted,
                    deleted,
                    m.delta_rows,
                    self.spark_seconds,
                )
                result.outcome.spark_jobs = figures.jobs
                result.outcome.seconds = time.monotonic() - self.started
            m.applied = True
            self.lead_recorded = self.lead_recorded or m.history_id == lead
        except FallbackToFull as exc:
            return self._full_instead(m, exc)
        except Cancelled:
            history.record_abandoned(self.r.conn, m.history_id)
            raise
        except Exception as exc:
            with jobs.attributed(figures, f"refresh {m.st.display}"):
                result.error = self.r.failed(m.st, m.history_id, exc)
            self.lead_recorded = self.lead_recorded or m.history_id == lead
        return result

    def _full_instead(self, m: _Member, why: FallbackToFull) -> BatchResult:
        assert m.prepared is not None and m.history_id is not None
        result = BatchResult(m.st)
        with jobs.counting(f"pgtrickle-{m.st.pgt_id}", f"refresh {m.st.display}") as count:
            try:
                result.outcome = self.r.fall_back_to_full(
                    m.st, m.prepared.plan, m.history_id, m.request.request_ids, m.prepared.layout, why
                )
                result.outcome.spark_jobs = (count.recorded or jobs.figures()).jobs
            except Cancelled:
                history.record_abandoned(self.r.conn, m.history_id)
                raise
            except Exception as exc:
                result.error = self.r.failed(m.st, m.history_id, exc)
        return result

    def _own(self, request: BatchRequest, prepared: Prepared, history_id: int | None) -> BatchResult:
        """A member refreshed as it would be alone (its planned refresh, its own snapshot and jobs)."""
        result = BatchResult(request.st)
        st = replace(request.st, watermark_mark=prepared.mark)
        started = time.monotonic()
        if history_id is None:
            history_id = history.start_history(self.r.conn, st, prepared.plan, request.initiated_by)
        try:
            result.outcome = self.r.execute(st, prepared.plan, history_id, request.request_ids, prepared)
            result.outcome.seconds = time.monotonic() - started
        except Cancelled:
            raise
        except Exception as exc:  # recorded by execute
            result.error = exc
        return result


def _flat(i: int, j: int, pgt_id: int, slots: Sequence[int]) -> str:
    """Column ``j`` of member ``i`` of a staged union, in its own column ``m<i>_c<j>``: from its
    slot's struct, only in its own rows where other members share the slot."""
    value = f"m{slots[i]}.c{j}"
    if slots.count(slots[i]) > 1:
        value = f"CASE WHEN {MEMBER} = {int(pgt_id)} THEN {value} END"
    return f"{value} AS m{i}_c{j}"
