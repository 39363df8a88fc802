"""Running one refresh of one stream table, end to end.

0. Decide the mode (:mod:`pgtrickle.refresh.modes`: cached per query text, recorded in the
   catalog, the table's layout made to match).
1. Take a snapshot S2 (with WAL capture, wait until the decoder has passed
   it) and count the changes pending between the frontier and S2, through the
   gates (:mod:`pgtrickle.refresh.gating`). None (and nothing to reinitialize):
   advance the frontier to S2 without starting any Spark job (``NO_DATA``).
2. Otherwise a coordinator transaction exports a snapshot (:meth:`Refresher.coordinator`);
   Spark reads every source at it over JDBC and computes the new contents
   (:mod:`pgtrickle.refresh.full`) or the change (:mod:`pgtrickle.refresh.differential`,
   which falls back to FULL when it must), moved into PostgreSQL by COPY when
   small, by partitioned JDBC writes into an unlogged staging table when large.
3. One PostgreSQL transaction applies it, records the refresh in the stream
   table's change buffer (for downstream stream tables), advances the frontier
   and completes the history row — so a crash anywhere leaves the previous
   state intact (docs/ARCHITECTURE.md, invariant 2).

Here: the Spark session and cancellation, prepare / execute with the failure a refresh
records, the per-database caches, and the read snapshot. The parts use the refresher only
through :class:`~pgtrickle.refresh.context.RefreshContext`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, field, replace

import psycopg

from pgtrickle.catalog import identity
from pgtrickle.catalog.store import Source, StreamTable
from pgtrickle.config import Settings
from pgtrickle.db.connection import connect, jdbc_target
from pgtrickle.db.query import one_row
from pgtrickle.dvm.layout import DeltaMode, Layout, plan_layout
from pgtrickle.errors import PgTrickleError, RefreshError, ValueNotCarriedError
from pgtrickle.gates.watermark_gate import WatermarkMark
from pgtrickle.ops import health
from pgtrickle.ops.error_redaction import full_error, public_error, redact_message
from pgtrickle.refresh import history
from pgtrickle.refresh.context import GroupContext, ProgressFn
from pgtrickle.refresh.differential import DifferentialRun
from pgtrickle.refresh.full import FullRun
from pgtrickle.refresh.gating import Gating
from pgtrickle.refresh.modes import AlreadyRecorded, RefreshModes, visible_columns
from pgtrickle.refresh.plan import (
    Action,
    ModeContext,
    RefreshPlan,
)
from pgtrickle.refresh.read_names import FallbackToFull
from pgtrickle.spark import carry, jdbc
from pgtrickle.spark.capabilities import join_count
from pgtrickle.spark.jobs import counting
from pgtrickle.spark.jobs import figures as job_figures

log = logging.getLogger(__name__)


@dataclass
class RefreshOutcome:
    st: StreamTable
    action: Action
    reason: str
    rows_inserted: int = 0
    rows_deleted: int = 0
    delta_rows: int = 0
    seconds: float = 0.0
    spark_seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    spark_jobs: int | None = 0
    """The Spark jobs it ran (0 for NO_DATA and SKIP; ``None``: not counted, e.g. on Spark Connect);
    see spark/jobs.py."""


@dataclass(frozen=True)
class Prepared:
    """A refresh analysed and planned, ready to run."""

    analysis: DeltaMode
    layout: Layout
    plan: RefreshPlan
    mark: WatermarkMark | None
    mode: ModeContext = field(default_factory=ModeContext)
    """What the mode decision knew (an atomic group asks it whether a member could refresh
    differentially from an upstream member's change: ``plan.differential_blocker``)."""


class Cancelled(PgTrickleError):
    """The refresh was abandoned on request (second SIGINT/SIGTERM)."""


_SHARED_CACHES: dict[str, tuple[dict, dict, dict]] = {}
"""Per database (DSN): query analyses, table layouts made, differential plans. Keys hold the
stream table's id and query text, so a changed query or a recreated table misses.

Parallel refreshes (daemon/workers.py) share them from several threads: an entry is built
outside any lock (two threads may both build one; the builds agree) and the first one stored
wins (:data:`_CACHE_LOCK`), so every thread then uses the same value."""

_CACHE_LOCK = threading.Lock()


class Refresher:
    """Refreshes stream tables; owns one catalog connection and uses the shared SparkSession."""

    def __init__(
        self,
        settings: Settings,
        dsn: str,
        *,
        progress: ProgressFn | None = None,
        spark_provider: Callable[[Settings], object] | None = None,
    ) -> None:
        self.settings = settings
        self.dsn = dsn
        self.target = jdbc_target(dsn)
        self.progress = progress or (lambda msg: None)
        self._spark_provider = spark_provider
        self._cancel_requested = False
        # Shared by every refresher of this process for the same database, so one-shot
        # refreshes (`pgtrickle refresh`, refresh_sync) reuse the plans the last one made.
        shared = _SHARED_CACHES.setdefault(dsn, ({}, {}, {}))
        self.modes = RefreshModes(self, shared[0], shared[1])
        """The refresh-mode decisions and their recording (refresh/modes.py)."""
        self.gating = Gating(self)
        """Planning through the gates, and NO_DATA (refresh/gating.py)."""
        self.dvm_cache: dict[tuple, object] = shared[2]
        """Differential plans that do not change between refreshes (translated SQL, view names, ...)."""
        self.conn = connect(dsn, application_name="pgtrickle-refresh")
        self.group: GroupContext | None = None
        """Set while an atomic group refreshes: its shared snapshot, transaction and member views."""

    def close(self) -> None:
        self.conn.close()

    def reconnect(self) -> None:
        """A new catalog connection (after PostgreSQL was lost); the old one is closed."""
        with suppress(psycopg.Error):
            self.conn.close()
        self.conn = connect(self.dsn, application_name="pgtrickle-refresh")

    # ------------------------------------------------------------- spark
    @property
    def spark(self):
        if self._spark_provider is None:
            from pgtrickle.spark.session import get_spark

            self._spark_provider = get_spark
        session = self._spark_provider(self.settings)
        join_count(session)  # a refresh in progress counts this session's jobs (spark/jobs.py)
        return session

    def clear_cancel(self) -> None:
        """A new refresh (or atomic group) begins: an earlier cancellation request does not apply to it."""
        self._cancel_requested = False

    def cancel(self) -> None:
        """Abandon the refresh in progress: cancel its Spark jobs; nothing is applied."""
        self._cancel_requested = True
        from pgtrickle.spark.session import cancel_all_jobs

        cancel_all_jobs()

    def check_cancel(self) -> None:
        """Raise :class:`Cancelled` when the refresh was abandoned on request."""
        if self._cancel_requested:
            raise Cancelled("refresh abandoned on request; the stream table is unchanged")

    # ------------------------------------------------------------ refresh
    def refresh(
        self,
        st: StreamTable,
        initiated_by: str,
        request_ids: Sequence[int] = (),
        record_no_data: bool = False,
        force: bool = False,
    ) -> RefreshOutcome:
        """Bring ``st`` up to date. Raises RefreshError (history records it) on failure.

        ``force`` passes the gates (an open circuit breaker, a closed watermark
        gate, a hold-back that cannot be honoured) for this refresh.
        """
        started = time.monotonic()
        self._cancel_requested = False
        prepared = self.prepare(st, request_ids, initiated_by, record_no_data, force)
        plan = prepared.plan
        if plan.action in (Action.NO_DATA, Action.SKIP):
            return RefreshOutcome(st, plan.action, plan.reason, seconds=time.monotonic() - started)
        st = replace(st, watermark_mark=prepared.mark)  # committed with the frontier
        history_id = history.start_history(self.conn, st, plan, initiated_by)
        outcome = self.execute(st, plan, history_id, request_ids, prepared)
        outcome.seconds = time.monotonic() - started
        return outcome

    def prepare(
        self,
        st: StreamTable,
        request_ids: Sequence[int],
        initiated_by: str,
        record_no_data: bool,
        force: bool = False,
        snapshot: str | None = None,
        defer_no_data: bool = False,
    ) -> Prepared:
        """Analyse, lay out and plan a refresh of ``st`` (see :meth:`.gating.Gating.plan_and_maybe_skip`).

        A failure here is recorded (history, error count, alerts) and raised; no Spark job
        runs here, so its history row counts none.
        """
        with counting(f"pgtrickle-{st.pgt_id}", f"prepare {st.display}"):
            return self._prepare_refresh(
                st, request_ids, initiated_by, record_no_data, force, snapshot, defer_no_data
            )

    def _prepare_refresh(
        self,
        st: StreamTable,
        request_ids: Sequence[int],
        initiated_by: str,
        record_no_data: bool,
        force: bool,
        snapshot: str | None,
        defer_no_data: bool,
    ) -> Prepared:
        try:
            analysis, differential, layout, layout_changed = self.modes.prepare(st, initiated_by)
            mode = ModeContext(
                differential=differential,
                reason=analysis.reason,
                layout_changed=layout_changed,
                reads_clock=st.reads_clock,
            )
            plan, mark = self.gating.plan_and_maybe_skip(
                st,
                request_ids,
                initiated_by,
                record_no_data,
                force,
                mode,
                snapshot=snapshot,
                defer_no_data=defer_no_data,
            )
        except AlreadyRecorded as done:
            raise done.error from None
        except Exception as exc:
            # Failed before any Spark job (analysis, layout, planning): a failed refresh all the same.
            message = public_error(exc)
            _log_full_error(st, exc, message)
            attempted = Action.DIFFERENTIAL if st.refresh_mode == "DIFFERENTIAL" else Action.FULL
            history_id = history.start_history(
                self.conn, st, RefreshPlan(attempted, "failed while preparing the refresh", 0), initiated_by
            )
            history.record_failure(self.conn, st, history_id, message, fatal=health.is_fatal(exc))
            if isinstance(exc, PgTrickleError):
                raise
            raise RefreshError(f"refresh of {st.display} failed: {message}") from exc
        return Prepared(analysis, layout, plan, mark, mode)

    def execute(
        self,
        st: StreamTable,
        plan: RefreshPlan,
        history_id: int,
        request_ids: Sequence[int],
        prepared: Prepared,
    ) -> RefreshOutcome:
        """Run a planned FULL or DIFFERENTIAL refresh whose history row exists.

        A failure is recorded and raised — except inside an atomic group, whose
        transaction is rolled back and which records the failure itself. The Spark jobs it
        runs are counted (:mod:`pgtrickle.spark.jobs`) and recorded with the outcome.
        """
        with counting(f"pgtrickle-{st.pgt_id}", f"refresh {st.display}") as count:
            outcome = self._execute(st, plan, history_id, request_ids, prepared)
            outcome.spark_jobs = (count.recorded or job_figures()).jobs
            return outcome

    def _execute(
        self,
        st: StreamTable,
        plan: RefreshPlan,
        history_id: int,
        request_ids: Sequence[int],
        prepared: Prepared,
    ) -> RefreshOutcome:
        try:
            if plan.action is Action.DIFFERENTIAL:
                return self._differential_or_fallback(
                    st, plan, history_id, request_ids, prepared.analysis, prepared.layout
                )
            return self._full_refresh(st, plan, history_id, request_ids, prepared.layout)
        except Cancelled:
            if self.group is None:
                history.record_abandoned(self.conn, history_id)
            raise
        except Exception as exc:
            raise self.failed(st, history_id, exc) from exc

    def failed(self, st: StreamTable, history_id: int, exc: Exception) -> Exception:
        """Record the failure ``exc`` of a refresh whose history row exists (not inside an atomic
        group, which records it itself); the error to raise for it."""
        from pgtrickle.spark.session import discard_lost_session

        discard_lost_session(exc)
        message = public_error(exc)
        refused = carry.refusal_in(exc)
        full = message
        if refused is not None:
            # pgtrickle's own message, naming the column and the value: the value is masked where
            # other roles read it (the catalog, alerts), kept in the raised error and the log.
            full = refused.message + (f" (hint: {refused.hint})" if refused.hint else "")
            message = redact_message(full)
        _log_full_error(st, exc, message)
        if self.group is None:
            history.record_failure(self.conn, st, history_id, message, fatal=health.is_fatal(exc))
        if isinstance(exc, PgTrickleError):
            return exc
        if refused is not None:
            return ValueNotCarriedError(f"refresh of {st.display} refused: {full}", refused.sqlstate)
        return RefreshError(f"refresh of {st.display} failed: {message}")

    def cached(self, key: tuple, build: Callable[[], object]):
        """``build()``, computed once per key for the life of this refresher."""
        if key in self.dvm_cache:
            return self.dvm_cache[key]
        value = build()
        with _CACHE_LOCK:
            return self.dvm_cache.setdefault(key, value)

    def carried_columns(self, source: Source) -> list[tuple[str, str]] | None:
        """(name, base type) of ``source``'s columns when one is not read as it is; see spark/carry.py."""
        return self.cached(
            ("carry", source.relid, source.column_types),
            lambda: carry.source_columns(self.conn, source.relid, source.column_types),
        )

    def source_select(self, source: Source) -> str | None:
        """The select list reading ``source`` exactly (``None``: read it as it is); see spark/carry.py."""
        columns = self.carried_columns(source)
        if columns is None:
            return None
        return carry.select_list(columns, f"{source.schema}.{source.name}").as_string(self.conn)

    def view_name(self, pgt_id: int, key: tuple) -> str:
        """A stable Spark view name for a key-filtered read (so cached SQL keeps matching)."""
        with _CACHE_LOCK:
            names = self.dvm_cache.setdefault(("view-names", pgt_id), {})
            assert isinstance(names, dict)
            return names.setdefault(key, f"pgt_{pgt_id}_p{len(names)}")

    # ------------------------------------------------------------- modes
    def analysis(self, st: StreamTable) -> DeltaMode:
        """The refresh-mode decision of ``st``'s query (cached per query text): see refresh/modes.py."""
        return self.modes.analysis(st)

    def demote(self, st: StreamTable, reason: str) -> None:
        """Analyse ``st``'s query as FULL-only from now on (its differential plan failed on Spark)."""
        self.modes.demote(st, reason)

    def _differential_or_fallback(
        self,
        st: StreamTable,
        plan: RefreshPlan,
        history_id: int,
        request_ids: Sequence[int],
        analysis: DeltaMode,
        layout: Layout,
    ) -> RefreshOutcome:
        run = DifferentialRun(self, st, analysis, layout)
        try:
            inserted, deleted, delta_rows, spark_seconds = run.run(history_id, request_ids)
        except FallbackToFull as why:
            return self.fall_back_to_full(st, plan, history_id, request_ids, layout, why)
        return self.differential_outcome(
            st, plan, history_id, run, inserted, deleted, delta_rows, spark_seconds
        )

    def fall_back_to_full(
        self,
        st: StreamTable,
        plan: RefreshPlan,
        history_id: int,
        request_ids: Sequence[int],
        layout: Layout,
        why: Exception,
    ) -> RefreshOutcome:
        """A differential refresh that cannot run (``why``) runs FULL instead, said in its history row."""
        reason = f"differential refresh fell back to FULL: {why}"
        log.warning("%s: %s", st.display, reason)
        self.conn.execute(
            "UPDATE pgtrickle.pgt_refresh_history SET action = 'FULL', was_full_fallback = true,"
            " mode_reason = %s WHERE refresh_id = %s",
            (reason, history_id),
        )
        full_plan = RefreshPlan(Action.FULL, reason, plan.delta_rows, plan.delta_deletes, True)
        return self._full_refresh(st, full_plan, history_id, request_ids, layout)

    def differential_outcome(
        self,
        st: StreamTable,
        plan: RefreshPlan,
        history_id: int,
        run: DifferentialRun,
        inserted: int,
        deleted: int,
        delta_rows: int,
        spark_seconds: float,
    ) -> RefreshOutcome:
        """The outcome of a completed differential ``run``; its history row names the rules it ran."""
        reason = plan.reason
        if run.rules:
            # The history names the rules this refresh ran (never a silent whole-query recompute),
            # once: the analysis's reason names the same rules when every source changed.
            same = reason == f"differential: {run.rules}"
            reason = f"differential; rules: {run.rules}" if same else f"{reason}; rules: {run.rules}"
            self.conn.execute(
                "UPDATE pgtrickle.pgt_refresh_history SET mode_reason = %s WHERE refresh_id = %s",
                (reason, history_id),
            )
        return RefreshOutcome(
            st,
            Action.DIFFERENTIAL,
            reason,
            rows_inserted=inserted,
            rows_deleted=deleted,
            delta_rows=delta_rows,
            spark_seconds=spark_seconds,
            timings=run.timings,
        )

    # ---------------------------------------------------------- snapshots
    @contextmanager
    def staging_conn(self) -> Iterator[psycopg.Connection]:
        """Where to create a staging table Spark writes into: inside an atomic group's open
        transaction a table would be invisible to Spark's connections, so a short one of its own."""
        if self.group is None:
            yield self.conn
            return
        with connect(self.dsn, application_name="pgtrickle-staging") as conn:
            yield conn

    def coordinator(self, sources: Sequence[Source] = ()):
        """The read transaction of a refresh: (connection context, exported snapshot id, snapshot, lsn).

        An atomic group shares its own; otherwise a new REPEATABLE READ transaction exports one.
        It pins ``sources`` (catalog.identity): until it ends, their names lead to the tracked
        tables, for every Spark connection that reads them at its snapshot. (Not READ ONLY:
        pinning takes row locks.)
        """
        if self.group is not None:  # the group's coordinator pinned every source when it began
            g = self.group
            return nullcontext(g.coord), g.snap_id, g.snapshot, g.lsn
        coord = connect(self.dsn, autocommit=False, application_name="pgtrickle-coordinator")
        try:
            coord.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            snap_id, snapshot, lsn = one_row(
                coord.execute(
                    "SELECT pg_export_snapshot(), pg_current_snapshot()::text, pg_current_wal_lsn()::text"
                )
            )
            pins = identity.source_pins(sources)
            identity.pin(coord, pins, identity.READ)
            jdbc.guard_snapshot(snap_id, identity.session_guard(pins))
        except BaseException:
            coord.close()
            raise
        return coord, snap_id, snapshot, lsn

    def commit_snapshot(self, snapshot: str) -> str:
        """The frontier to commit for a refresh that read at ``snapshot`` (a group's includes its own xid)."""
        return self.group.commit_snapshot if self.group is not None else snapshot

    # ---------------------------------------------------------- FULL path
    def _full_refresh(
        self,
        st: StreamTable,
        plan: RefreshPlan,
        history_id: int,
        request_ids: Sequence[int],
        layout: Layout | None = None,
    ) -> RefreshOutcome:
        layout = layout or plan_layout(
            visible_columns(st),
            {c.name: c.type for c in st.columns},
            st.qualified,
            DeltaMode(False, ""),
            False,
        )
        run = FullRun(self, st, layout)
        inserted, deleted, spark_seconds = run.run(plan, history_id, request_ids)
        return RefreshOutcome(
            st,
            Action.FULL,
            plan.reason,
            rows_inserted=inserted,
            rows_deleted=deleted,
            delta_rows=plan.delta_rows,
            spark_seconds=spark_seconds,
            timings=run.timings,
        )


def _log_full_error(st: StreamTable, exc: BaseException, public: str) -> None:
    """The whole error, which may quote source rows, goes to the daemon's log only."""
    full = full_error(exc)
    if full != public:
        log.warning("%s: refresh failed: %s (stored without its values as: %s)", st.display, full, public)
