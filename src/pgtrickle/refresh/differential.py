"""DIFFERENTIAL refresh: the compositional delta engine on Spark, the merge in PostgreSQL.

1. A coordinator transaction exports snapshot S2; with WAL capture the decoder is waited for
   until it has passed S2. The window (frontier, S2] is counted again (the plan's counts are
   from an earlier snapshot); a truncated source means FULL.
2. The plan: :func:`pgtrickle.dvm.pipeline.plan_delta` over the relations with pending changes
   (one rule per operator, composed; cached per set of changed relations): ONE consolidated
   Spark SQL query, the stored columns and the weight ``__pgt_w``. For a stream table keeping
   its root aggregate's state (:mod:`pgtrickle.dvm.stored`): the change of the aggregate's input
   by the same rules, aggregated once by weight into the change of each state column per
   touched group (:mod:`pgtrickle.dvm.state_change`) - the stored state is not read by Spark.
3. Its reads become Spark views (:mod:`pgtrickle.refresh.delta_reads`): change buffers as Z-sets,
   sources at S2, key-bounded where the plan allows (:mod:`pgtrickle.dvm.keyed`). Inside an
   atomic group, an upstream member's change is the one the group computed and applied before
   this member, in the same transaction (:mod:`pgtrickle.refresh.group_changes`).
4. One Spark action: a small delta is collected (then COPYed), a large one written by
   partitioned JDBC into a staging table. Row identity ``__pgt_row_id``: xxhash64 of the visible
   columns (a stored aggregate's: of its group keys), as a FULL refresh computes it. A query
   keeping nodes in hidden state tables (:mod:`pgtrickle.dvm.kept`) is ONE plan too: each hidden
   table's change (children first) and each sub-plan computed first (:mod:`pgtrickle.dvm.shared`)
   is a view the plans above read, a lazy local checkpoint
   (:func:`pgtrickle.spark.planning.computed_once`: planned once, a leaf for the plans reading
   it, computed once); the action collects the union of the hidden tables' changes and the
   stream table's delta, each row tagged with its target (:mod:`pgtrickle.refresh.tagged`). Over
   :data:`COPY_MAX_ROWS` rows each target is collected on its own from the computed views (a
   hidden table's change over the limit: FULL; the delta: staged by JDBC when large).
5. One PostgreSQL transaction applies it (:mod:`pgtrickle.refresh.delta_apply`; a state change
   is merged into the stored groups, :mod:`pgtrickle.refresh.state_merge`) and each hidden
   table's change (:func:`pgtrickle.refresh.state_tables.apply_state_change`), records it in
   the stream table's own change buffer for downstream stream tables, advances the frontier and
   completes the history row. A delta that does not match the table (it never should) aborts
   the transaction and the engine refreshes in full instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from pgtrickle import faults
from pgtrickle.catalog.store import StreamTable
from pgtrickle.cdc.buffers import PendingChanges, pending_changes
from pgtrickle.cdc.wal import wait_for_decoder
from pgtrickle.dvm import ir, keyed, materialize, shared
from pgtrickle.dvm.compile import Compiled
from pgtrickle.dvm.kept import StateTable, fingerprint, node_query
from pgtrickle.dvm.layout import ROW_ID, DeltaMode, Layout
from pgtrickle.dvm.pipeline import plan_delta
from pgtrickle.dvm.shared import Split
from pgtrickle.dvm.state_change import state_change
from pgtrickle.errors import UnsupportedQueryError
from pgtrickle.refresh import commit, history, unread_updates, user_triggers
from pgtrickle.refresh.context import RefreshContext
from pgtrickle.refresh.delta_apply import DeltaApply, DeltaMismatch, Staged, own_buffer, stage_delta
from pgtrickle.refresh.delta_reads import DeltaReads, Window
from pgtrickle.refresh.key_bounds import should_push_down
from pgtrickle.refresh.layout_ddl import equality_operators
from pgtrickle.refresh.output import finished_columns, for_copy, timestamps
from pgtrickle.refresh.read_names import FallbackToFull, ReadNames, relation_key, spark_name
from pgtrickle.refresh.shared_reads import SharedReads
from pgtrickle.refresh.spark_job import (
    ROWS_READ_WHOLE,
    code_generation,
    data_error_state,
    lone_compiles,
    shuffle_sized,
)
from pgtrickle.refresh.state_merge import StateMerge
from pgtrickle.refresh.state_tables import StateMismatch, apply_state_change, as_stored, stored_decimals
from pgtrickle.refresh.tagged import split_rows, union_sql
from pgtrickle.spark import carry, planning
from pgtrickle.spark.capabilities import tag_jobs

__all__ = ["DifferentialRun", "FallbackToFull", "should_push_down", "spark_name"]

COPY_MAX_ROWS = 200_000
"""Deltas up to this many rows are collected and COPYed; larger ones go by partitioned JDBC."""


@dataclass(frozen=True)
class Prepared:
    """A delta plan compiled for one set of changed relations (cached across refreshes)."""

    spark_sql: str
    columns: tuple[str, ...]
    compiled: object
    restrictions: dict
    rules: str
    read_columns: dict[str, frozenset[str]]
    """Per relation, every source column a Scan or Delta of the plan reads (one view serves all)."""
    kept: tuple[tuple[StateTable, Split | None, str], ...] = ()
    """Per hidden state table (dvm/kept.py), children first, the change to apply to it
    (``None``: unchanged), split at the sub-plans computed first (:mod:`pgtrickle.dvm.shared`),
    and the Spark view the plans above it read that change from."""
    kept_views: dict[str, StateTable] = field(default_factory=dict)
    """The Spark view of each hidden state table the plans read."""
    split: Split | None = None
    """With hidden state tables: the plan split at the sub-plans computed first."""
    raw_sql: str | None = None
    """The delta before its final consolidation (``None``: the plan does not end with one)."""


class DifferentialRun:
    """One differential refresh of one stream table (used by the engine)."""

    def __init__(self, refresher: RefreshContext, st: StreamTable, mode: DeltaMode, layout: Layout) -> None:
        self.r = refresher
        self.st = st
        self.mode = mode
        self.layout = layout
        self.conn: psycopg.Connection = refresher.conn
        self.timings: dict[str, float] = {}
        self.rules = ""
        """The rules this run's plan applied (for the history)."""
        self.kept_rows: list[tuple[StateTable, list[tuple]]] = []
        """Each hidden state table's change computed by this run (applied with the stream table's)."""
        self.report_xid = False
        """Record the apply transaction's id in :attr:`xid` (a batch member feeding a chained one)."""
        self.xid: int | None = None
        """The apply transaction's id once committed (``None``: it wrote nothing, or not asked)."""
        self.pending_rows = 0
        """The changes pending in the window, every source's (for the history)."""
        self.pending_sources: frozenset[int] = frozenset()
        """The sources with any change pending in the window (those :meth:`changes` leaves out too)."""
        self._codegen: Callable[[], None] = lambda: None
        """Called before each of this run's plans is prepared: code generation on or off for it."""

    # ---------------------------------------------------------------- main
    def run(self, history_id: int, request_ids: Sequence[int]) -> tuple[int, int, int, float]:
        """Returns (inserted, deleted, delta rows, spark seconds)."""
        st = self.st
        coordinator, snap_id, snapshot, lsn = self.r.coordinator(st.sources)
        rows: list[tuple] | Staged = []
        with coordinator as coord:
            if self.r.group is None and (
                any(s.kind == "TABLE" and s.cdc_mode == "wal" for s in st.sources)
                or history.wal_capture_set_up(self.conn)
            ):
                wait_for_decoder(self.conn, self.r.dsn)
            changed = self.changes(snapshot)
            t0 = time.monotonic()
            if changed:
                faults.point("refresh.spark_job")
                window = Window(st.frontier or "", snapshot, snap_id, coord)
                try:
                    with carry.refusals_checked(lambda: self.r.spark, coord):
                        rows = self._compute(window, changed)
                except Exception as exc:
                    self.plan_failed(exc)
                    raise
            spark_seconds = time.monotonic() - t0
            if self.r.group is None:
                coord.rollback()
        self.r.check_cancel()
        inserted, deleted = self.apply_rows(
            rows, history_id, self.r.commit_snapshot(snapshot), lsn, request_ids, spark_seconds
        )
        return inserted, deleted, self.pending_rows, spark_seconds

    def changes(self, snapshot: str) -> dict[int, PendingChanges]:
        """The changes pending per source between the frontier and ``snapshot`` (a truncated source:
        FallbackToFull)."""
        assert self.st.frontier is not None
        pending = pending_changes(self.conn, self.st.sources, self.st.frontier, snapshot)
        group = self.r.group
        if group is not None:
            pending = [self._from_group(p) if group.reads_from_group(p.source) else p for p in pending]
        truncated = [p.source for p in pending if p.truncated]
        if truncated:
            raise FallbackToFull(
                f"source {truncated[0].schema}.{truncated[0].name} was truncated or refreshed in full"
            )
        found = {p.source.relid: p for p in pending if p.rows > 0}
        self.pending_rows = sum(p.rows for p in found.values())
        self.pending_sources = frozenset(found)
        return self._affecting(found, snapshot)

    def _affecting(self, pending: dict[int, PendingChanges], snapshot: str) -> dict[int, PendingChanges]:
        """``pending`` but the sources whose changes the query cannot see (refresh/unread_updates.py)."""
        tree, group, st = self.mode.tree, self.r.group, self.st
        if tree is None or st.frontier is None:
            return pending
        key = ("query-columns", st.pgt_id, st.normalized_query)
        columns = self.r.cached(key, lambda: unread_updates.query_columns(tree))
        skip = (lambda source: group.reads_from_group(source)) if group is not None else (lambda _s: False)
        return unread_updates.affecting(
            self.conn, pending, columns, (st.frontier, snapshot), skip, self.timings
        )

    def _from_group(self, window: PendingChanges) -> PendingChanges:
        """An upstream member's change in an atomic group: what the group's transaction wrote into
        its change buffer (refresh/group_changes.py). Its buffer must hold nothing in this stream
        table's own window (the group decided so: refresh/group_plan.py)."""
        source = window.source
        if window.rows or window.truncated:
            raise FallbackToFull(
                f"upstream member {source.schema}.{source.name} has changes this stream table "
                "has not taken yet"
            )
        assert self.r.group is not None and self.r.group.changes is not None
        return self.r.group.changes.written(self.conn, source)

    def plan_failed(self, exc: BaseException) -> None:
        """The delta's Spark job (or its planning) failed with ``exc``: raise FallbackToFull when a
        FULL refresh should run instead (a value Spark cannot carry; an AUTO plan Spark refuses)."""
        refused = carry.refusal_in(exc)
        if refused is None:
            state = data_error_state(exc)
            if state is not None:
                # A data error (an overflow, a bad cast) may come from rows the window's changes
                # cancel or replace (inserted, then deleted): the query over the sources at the
                # new snapshot may not raise it. Recompute; if it still does, FULL fails in turn.
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
                raise FallbackToFull(
                    f"computing the change raised a data error on Spark (SQLSTATE {state}: {first})"
                ) from exc
            self._demote_if_plan_fails(exc)
            return
        # A change in the window (say, a row inserted and deleted again) holds a value
        # Spark cannot carry: the sources at the new snapshot may not, so recompute;
        # if they still do, the FULL refresh refuses it in turn.
        raise FallbackToFull(f"a change holds a value Spark cannot carry ({refused.message})") from exc

    def _demote_if_plan_fails(self, exc: BaseException) -> None:
        """AUTO never settles on a differential plan Spark refuses: refresh FULL from now on, saying why.

        A delta query Spark cannot analyse (or pgtrickle cannot translate) fails the same way at
        every refresh; the query itself ran at the initial FULL. So an ``AUTO`` stream table runs
        FULL now and is analysed FULL (with this reason) until the daemon restarts; with
        ``refresh_mode => 'DIFFERENTIAL'`` the error stands.
        """
        from pyspark.errors import AnalysisException

        if self.st.refresh_mode != "AUTO" or not isinstance(exc, (AnalysisException, UnsupportedQueryError)):
            return
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        reason = f"the differential plan of this query cannot run on Spark ({first}): it is refreshed in full"
        self.r.demote(self.st, reason)
        raise FallbackToFull(reason) from exc

    # ------------------------------------------------------------- spark
    def _plan(self, changed: frozenset[str]) -> Prepared | None:
        """The consolidated delta query for this set of changed relations (pure but for caching)."""
        st, mode = self.st, self.mode
        types = {relation_key(s): dict(s.column_types) for s in st.sources}
        relations = {relation_key(s): (s.schema, s.name) for s in st.sources}
        names = ReadNames(
            st.pgt_id,
            {relation_key(s): s.relid for s in st.sources},
            {fingerprint(t.query): t for t in self.layout.state_tables},
            lambda node: fingerprint(node_query(node, relations, types)),
        )
        kept: tuple[tuple[StateTable, Split | None, str], ...] = ()
        state_plans: tuple[ir.Node | None, ...] = ()
        stored = self.layout.stored
        if stored is not None:
            # decide_mode stores no root state for a query keeping nodes (dvm/layout.py): this
            # path never has hidden state tables to bring up to date.
            assert mode.tree is not None and not self.layout.state_tables
            found = state_change(stored, changed, tuple(materialize.decide(mode.tree)), names, types)
            if found is None:
                return None
            plan, compiled = found.change, found.compiled
            rules_text = mode.rules
        else:
            schema = {relation_key(s): [c for c, _ in s.column_types] for s in st.sources}
            delta = plan_delta(
                st.normalized_query,
                schema,
                types,
                changed,
                "spark",
                reads=names,
                keep_state=bool(self.layout.state_tables),
            )
            if delta.full_refresh_reason is not None:
                raise FallbackToFull(delta.full_refresh_reason)
            if delta.plan is None or delta.compiled is None:
                return None
            plan, compiled = delta.plan, delta.compiled
            kept = tuple(
                (
                    table,
                    shared.split_at_choice(change, f"pgt_{st.pgt_id}_first_{table.position}_"),
                    names.kept_change_view(table),
                )
                for node, change in delta.state_changes
                for table in (names.kept_table(node),)
            )
            state_plans = delta.state_plans
            rules_text = "; ".join(f"{type(s.node).__name__}: {s.rule}" for s in delta.steps)
        read_columns: dict[str, set[str]] = {}
        plans = [plan, *(p for p in state_plans if p is not None)]
        for node in (n for p in plans for n in ir.walk(p)):
            scan = node.scan if isinstance(node, ir.Delta) else node
            if isinstance(scan, ir.Scan):
                read_columns.setdefault(scan.relation, set()).update(scan.source_columns)
        return Prepared(
            compiled.sql(),
            compiled.columns,
            compiled,
            # The hidden tables' changes read the same views as the stream table's plan: a read
            # is bounded only where every one of these plans bounds it.
            keyed.restrictions(plan, *state_plans),
            rules_text,
            {relation: frozenset(cols) for relation, cols in read_columns.items()},
            kept,
            names.kept_views(),
            shared.root_split(compiled, f"pgt_{st.pgt_id}_first_root_", bool(kept)),
            compiled.unconsolidated_sql() if isinstance(compiled, Compiled) else None,
        )

    def _prepared(self, changed: dict[int, PendingChanges]) -> Prepared | None:
        """The plan for this set of changed sources (cached across refreshes)."""
        relations = frozenset(relation_key(s) for s in self.st.sources if s.relid in changed)
        prepared = self.r.cached(
            (
                "delta-plan",
                self.st.pgt_id,
                self.st.normalized_query,
                self.layout.columns,
                tuple(t.name for t in self.layout.state_tables),
                relations,
            ),
            lambda: self._plan(relations),
        )
        assert prepared is None or isinstance(prepared, Prepared)
        if prepared is not None:
            self.rules = prepared.rules
        return prepared

    def _compute(self, window: Window, changed: dict[int, PendingChanges]) -> list[tuple] | Staged:
        spark = self.r.spark
        tag_jobs(spark, f"pgtrickle-{self.st.pgt_id}", f"refresh {self.st.display}")
        prepared = self._prepared(changed)
        if prepared is None:
            return []
        reads = DeltaReads(self.r, self.st, window, self.layout.stored, self.timings)
        rows = sum(p.rows for p in changed.values())
        try:
            # With hidden tables the action collects a union of several plans: one round of its LIMIT.
            with (
                shuffle_sized(spark, rows, one_round=bool(prepared.kept)),
                code_generation(spark) as switch,
            ):
                # Each plan is prepared with the reads registered so far (spark_job.lone_compiles).
                in_parts = bool(prepared.kept) or prepared.split is not None
                self._codegen = lambda: switch(
                    lone_compiles(rows, self.timings.get(ROWS_READ_WHOLE, 0), in_parts)
                )
                self._codegen()  # the reads persisted as they are registered: bounded by the change
                reads.kept_views = prepared.kept_views
                # Each hidden table's change (children first) as a view the plans above read,
                # computed once; nothing runs until the one action below.
                kept = [
                    (table, self._kept_change(table, change, view, reads, prepared))
                    for table, change, view in prepared.kept
                    if change is not None
                ]
                reads.register(prepared.compiled, prepared.restrictions, prepared.read_columns)  # type: ignore[arg-type]
                spark_sql = prepared.spark_sql
                if prepared.split is not None:
                    spark_sql = self._computed_first(prepared.split, reads)
                output = self._output(spark_sql, prepared.columns)
                if not prepared.kept:
                    return self._collect(output)
                return self._one_job(kept, output, rows)
        finally:
            self._codegen = lambda: None
            reads.release()

    def batch_plan(self, changed: dict[int, PendingChanges]) -> Prepared | None:
        """For a batch (refresh/batch.py): the plan of this window's changes (``None``: nothing under
        the query changed). Only a plan without hidden state tables is computed by a shared job
        (FallbackToFull otherwise)."""
        prepared = self._prepared(changed)
        if prepared is not None and prepared.kept:
            raise FallbackToFull("the plan keeps hidden state tables: it is not computed by a shared job")
        return prepared

    def delta_text(self, window: Window, prepared: Prepared, shared: SharedReads) -> tuple[str, DeltaReads]:
        """For a batch: the delta of ``prepared`` as Spark SQL (c0.., ``__pgt_w``, ``__pgt_row_id``)
        over reads registered now from ``shared``, and those reads (the caller releases them once
        the shared job ran). The rows are those of the plan before its final consolidation where
        it ends with one: the batch consolidates every member's at once."""
        reads = DeltaReads(self.r, self.st, window, self.layout.stored, self.timings, shared)
        try:
            reads.register(prepared.compiled, prepared.restrictions, prepared.read_columns)  # type: ignore[arg-type]
            return self._output(prepared.raw_sql or prepared.spark_sql, prepared.columns), reads
        except BaseException:
            reads.release()
            raise

    def fed_text(self, prepared: Prepared, reads: DeltaReads, shared: SharedReads) -> str:
        """For a batch whose chained members read this member's delta (refresh/chained.py): the
        delta as a leaf computed once (:func:`~pgtrickle.spark.planning.computed_once`), offered
        to them through ``shared``; the member's own rows (as :meth:`delta_text`) read it too, so
        the job computes it once. Called once the reads it shares are persisted."""
        value = planning.sql(self.r.spark, prepared.raw_sql or prepared.spark_sql, self.timings, "fed")
        leaf = planning.computed_once(value, self.timings, "fed")
        view = f"pgt_{self.st.pgt_id}_fed"
        reads.provide(view, leaf, once=True)
        shared.feed(self.st.relid, leaf)
        return self._output(f"SELECT * FROM {view}", prepared.columns)

    def _computed_first(self, split: Split, reads: DeltaReads) -> str:
        """Register each sub-plan of ``split`` computed first as its view, a leaf computed once
        (:func:`~pgtrickle.spark.planning.computed_once`): Spark plans it once, here, and the plans
        reading it see one relation instead of its operators inlined at every read (dvm/shared.py);
        the action computes it once. The SQL of the plan reading them."""
        for view, part in split.first:
            value = planning.sql(self.r.spark, part.sql(), self.timings, "first")
            self._codegen()
            reads.provide(view, planning.computed_once(value, self.timings, "first"), once=True)
        return split.main.sql()

    def _kept_change(
        self, table: StateTable, change: Split, view: str, reads: DeltaReads, prepared: Prepared
    ) -> tuple[Any, str]:
        """A hidden state table's change, registered as the Spark view ``view`` (its columns and
        ``__pgt_w``; a leaf computed once) for the plans above it; returned as that leaf and the
        query of the rows to apply (c0.., ``__pgt_w``, ``__pgt_row_id``)."""
        reads.register(change.main, prepared.restrictions, prepared.read_columns)
        text = self._computed_first(change, reads)
        value = planning.sql(self.r.spark, text, self.timings, "kept")
        value = as_stored(value, stored_decimals(self.conn, table))
        self._codegen()
        leaf = planning.computed_once(value, self.timings, "kept")
        reads.provide(view, leaf, once=True)
        n = len(table.columns)
        columns = list(leaf.columns)
        names = [f"c{i}" for i in range(n)] + columns[n:]
        named = ", ".join(f"{spark_name(c)} AS {spark_name(m)}" for c, m in zip(columns, names, strict=True))
        select = ", ".join(finished_columns(names, timestamps(leaf.schema), table.hash_positions))
        return leaf, f"SELECT {select} FROM (SELECT {named} FROM {view}) AS __pgt_k"

    def _one_job(
        self, kept: Sequence[tuple[StateTable, tuple[Any, str]]], output: str, changes: int
    ) -> list[tuple] | Staged:
        """The hidden tables' changes and the stream table's delta computed by ONE action: their
        union, each row tagged with its target (:mod:`pgtrickle.refresh.tagged`). A union over
        :data:`COPY_MAX_ROWS` rows: each hidden table's change collected on its own (over the limit:
        FallbackToFull) and the delta collected or staged (:meth:`_collect`), from the computed views."""
        tags = list(range(len(kept) + 1))
        texts = [text for _, (_, text) in kept] + [output]
        widths = [len(table.columns) for table, _ in kept] + [len(self.layout.columns)]
        union = planning.sql(self.r.spark, union_sql(tags, widths, texts, changes), self.timings, "delta")
        self._codegen()
        rows = planning.planned(union.limit(COPY_MAX_ROWS + 1), self.timings, "delta").collect()
        if len(rows) <= COPY_MAX_ROWS:
            split = split_rows(rows, tags)
            self.kept_rows = [(table, split[i]) for i, (table, _) in enumerate(kept)]
            return split[len(kept)]
        del rows
        self.kept_rows = [(table, self._kept_rows(table, text)) for table, (_, text) in kept]
        return self._collect(output)

    def _kept_rows(self, table: StateTable, text: str) -> list[tuple]:
        """A hidden table's change collected on its own (FallbackToFull over :data:`COPY_MAX_ROWS` rows)."""
        frame = planning.sql(self.r.spark, text, self.timings, "kept")
        rows = frame.limit(COPY_MAX_ROWS + 1).collect()
        if len(rows) > COPY_MAX_ROWS:
            raise FallbackToFull(
                f"the change of the hidden state table {table.name} is over {COPY_MAX_ROWS:,} rows"
            )
        return [tuple(r) for r in rows]

    def _output(self, spark_sql: str, columns: Sequence[str]) -> str:
        """c0.. (timestamps rendered for COPY), ``__pgt_w`` and ``__pgt_row_id`` of the delta query.

        The row identity is xxhash64 of the columns at the layout's key positions, exactly as a
        FULL refresh computes it (:func:`pgtrickle.refresh.output.finish_output`).
        """
        if len(columns) != len(self.layout.columns):
            raise FallbackToFull(
                f"the delta plan returns columns {', '.join(columns)}, the stream table stores "
                f"{', '.join(self.layout.columns)}"
            )
        types = {c.name: c.type for c in self.st.columns}
        out = [for_copy(spark_name(c), types.get(c, "")) + f" AS c{i}" for i, c in enumerate(columns)]
        hashed = [spark_name(columns[i]) for i in self.layout.key_positions]
        row_id = f"xxhash64({', '.join(hashed)})" if hashed else "CAST(0 AS BIGINT)"
        return (
            f"SELECT {', '.join(out)}, {spark_name(ir.WEIGHT)}, {row_id} AS {ROW_ID} "
            f"FROM ({spark_sql}) AS __pgt_o"
        )

    def _collect(self, spark_sql: str) -> list[tuple] | Staged:
        """Run the job. Small results come back to the driver (then COPY); large ones go by JDBC."""
        df = planning.sql(self.r.spark, spark_sql, self.timings, "delta")
        self._codegen()
        rows = planning.planned(df.limit(COPY_MAX_ROWS + 1), self.timings, "delta").collect()
        if len(rows) <= COPY_MAX_ROWS:
            return [tuple(r) for r in rows]
        del rows
        self.r.progress(f"{self.st.display}: large delta: writing it by JDBC into a staging table")
        return stage_delta(self.r, self.st, [*self.layout.columns, ir.WEIGHT, ROW_ID], df)

    def _drop_staging(self, staged: Staged) -> None:
        from pgtrickle.refresh.delta_apply import RAW_TABLE, drop_temp

        drop_temp(self.conn, RAW_TABLE)
        self.conn.execute(f"DROP TABLE IF EXISTS {staged.table}")

    # ------------------------------------------------------------- apply
    def apply_rows(
        self,
        rows: list[tuple] | Staged,
        history_id: int,
        snapshot: str,
        lsn: str,
        request_ids: Sequence[int],
        spark_seconds: float,
    ) -> tuple[int, int]:
        """Apply the computed delta in one transaction (a mismatch: FallbackToFull); (inserted, deleted)."""
        t1 = time.monotonic()
        try:
            inserted, deleted = self._apply(
                rows,
                history_id,
                snapshot=snapshot,
                lsn=lsn,
                request_ids=request_ids,
                spark_seconds=spark_seconds,
            )
        except DeltaMismatch as err:
            raise FallbackToFull(str(err)) from err
        finally:
            if isinstance(rows, Staged):
                self._drop_staging(rows)
        self.timings["apply"] = time.monotonic() - t1
        self.timings["spark_job"] = spark_seconds
        return inserted, deleted

    def _apply(self, rows: list[tuple] | Staged, history_id: int, **completion: Any) -> tuple[int, int]:
        """The apply transaction; ``completion``: what :func:`commit.complete` records (snapshot, lsn,
        request ids, Spark seconds)."""
        st, conn = self.st, self.conn
        with conn.transaction():
            commit.lock_for_apply(conn, st)
            triggers = user_triggers.begin(conn, st, "DIFFERENTIAL")
            inserted = deleted = 0
            apply = None
            for table, kept_rows in self.kept_rows:
                try:
                    apply_state_change(conn, table, kept_rows, self._kept_equality(table))
                except StateMismatch as err:
                    raise DeltaMismatch(str(err)) from err
            if isinstance(rows, Staged) or rows:
                equality = self.r.cached(
                    ("equality", st.pgt_id, st.relid), lambda: equality_operators(conn, st.relid)
                )
                merge = StateMerge if self.layout.stored is not None else DeltaApply
                apply = merge(conn, st, self.layout, equality, own_buffer(conn, st))
                inserted, deleted = apply.apply(rows)
            commit.complete(
                conn,
                st,
                history_id=history_id,
                inserted=inserted,
                deleted=deleted,
                recomputed=False,
                **completion,
            )
            user_triggers.finish(conn, st, triggers, inserted, deleted, history_id)
            if self.r.group is not None and apply is not None:
                apply.cleanup()  # the group's transaction goes on: the next member makes its own
            if self.report_xid:
                xid = conn.execute("SELECT pg_current_xact_id_if_assigned()::text").fetchone()
                self.xid = int(xid[0]) if xid and xid[0] is not None else None
            faults.point("refresh.before_commit")
        faults.point("refresh.after_commit")
        return inserted, deleted

    def _kept_equality(self, table: StateTable) -> dict[str, str]:
        """``OPERATOR(s.=)`` of a hidden table's columns whose type has its ``=`` outside pg_catalog."""
        relid = self.conn.execute("SELECT %s::regclass::oid", (table.qualified,)).fetchone()
        assert relid is not None
        return self.r.cached(
            ("equality", "kept", table.name), lambda: equality_operators(self.conn, relid[0])
        )
