"""The reads of a differential refresh: each relation a delta plan reads, as a Spark view.

:class:`ReadNames` names them (deterministically, so a plan compiled once is reused at every
refresh); :class:`DeltaReads` registers each read of :attr:`Compiled.reads` once, for one
refresh window (frontier S1, snapshot S2):

- ``post(scan)``: the source at S2 over partitioned JDBC at the exported snapshot, every value
  read exactly (:mod:`pgtrickle.spark.carry`), broadcast to the change's side when small — or,
  when the plan bounds it by a change's keys (:func:`pgtrickle.dvm.keyed.restrictions`) and the
  table is large, only the rows with those keys, selected by PostgreSQL (``col = ANY(keys)``);
- ``delta(scan)``: the change buffer's rows of the window as a Z-set (new values +1, old values
  −1), read at a fresh snapshot with the window as an explicit predicate;
- inside an atomic group, for a source that is an upstream member: ``delta(scan)`` is that
  member's change in this refresh (the rows the group's transaction wrote into its change
  buffer, read through a committed copy: :mod:`pgtrickle.refresh.group_changes`), and
  ``post(scan)`` its stored rows at S2 ⊎ that change;
- the stored state of a stream table that keeps its root aggregate (``Materialized(state,
  pre=True)``): the stream table itself at S2 (= at S1: only its refreshes write it), key-bounded
  the same way.

A read used more than once by the plan is persisted when it is bounded by the change (a delta,
a key-bounded read); a whole-table read is read again instead of being cached whole.

The members of a batch (refresh/batch.py) share their reads through :class:`SharedReads`: the
stream tables of a fan read the same change buffer over the same window, so one JDBC relation
(one schema probe, one scan) serves them all, persisted when bounded and read by several.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import psycopg
from psycopg import sql

from pgtrickle.catalog.store import Source, StreamTable
from pgtrickle.cdc.buffers import images_equal
from pgtrickle.db.columns import column_types
from pgtrickle.dvm import ir
from pgtrickle.dvm.compile import Compiled, ReadKind
from pgtrickle.dvm.kept import SCHEMA, StateTable
from pgtrickle.dvm.keyed import KeySource, Restriction
from pgtrickle.dvm.stored import StoredAggregate
from pgtrickle.refresh.chained import column_why_not
from pgtrickle.refresh.context import RefreshContext
from pgtrickle.refresh.key_pushdown import KeyPushdown
from pgtrickle.refresh.read_names import (
    FallbackToFull,
    NotChained,
    relation_key,
    spark_name,
)
from pgtrickle.refresh.shared_reads import SharedReads, buffer_columns
from pgtrickle.refresh.spark_job import ROWS_READ_WHOLE
from pgtrickle.spark import carry, jdbc, overlap, planning
from pgtrickle.spark.capabilities import capabilities
from pgtrickle.sql.ident import quote_ident

WEIGHT = ir.WEIGHT
BROADCAST_MAX_BYTES = 10 * 1024 * 1024
"""Whole tables read for a join up to this size (:data:`pgtrickle.spark.jdbc.RELATION_BYTES`) are
broadcast to the change's side ..."""
BROADCAST_MAX_ROWS = 100_000
"""... when they also hold at most this many rows (``relpages`` lags a bulk load; the live rows
do not)."""


def small(stats: jdbc.TableStats) -> bool:
    """Whether a table is small enough to broadcast (pure): at most :data:`BROADCAST_MAX_BYTES` on
    disk and :data:`BROADCAST_MAX_ROWS` rows; a size not known (a partitioned or foreign table) is
    not small."""
    return (
        stats.bytes is not None
        and stats.bytes <= BROADCAST_MAX_BYTES
        and stats.reltuples <= BROADCAST_MAX_ROWS
    )


def broadcasts(stats: jdbc.TableStats, small_reads: int) -> bool:
    """Whether a table read whole is broadcast to the sides it is joined with, in a plan that reads
    small tables (:func:`small`) ``small_reads`` times in all (pure). Spark cannot size a JDBC
    relation, so without the hint every join with it shuffles both sides: a stage boundary in the
    plan's job. A broadcast is a Spark job of its own, started (all of a plan's at once) before the
    plan's: it pays where the plan joins small tables more than once - one shuffle saved per join,
    the broadcasts side by side (TPC-H Q5, Q7, Q8: nation, region, supplier in every join term) -
    and costs more than the one shuffle it saves where a plan's only join with a small table meets
    a small change (benchmark ``join_aggregate``: ~+0.05 s a refresh)."""
    return small_reads > 1 and small(stats)


def _read_as_other(base_type: str | None) -> bool:
    """Whether a column of ``base_type`` (``None``: read as it is) is read as another type (a
    range check alone still reads the value as it is: spark/carry.py)."""
    if base_type is None:
        return False
    how = carry.decide(base_type)
    return how.kind == carry.RECARRIED or how.read_as is not None


def window_predicate(frontier: str, upto: str) -> sql.Composed:
    return sql.SQL(
        "xid >= pg_snapshot_xmin({f}::pg_snapshot) AND NOT pg_visible_in_snapshot(xid, {f}::pg_snapshot)"
        " AND pg_visible_in_snapshot(xid, {u}::pg_snapshot)"
    ).format(f=sql.Literal(frontier), u=sql.Literal(upto))


@dataclass(frozen=True)
class Window:
    """The refresh window: from ``frontier`` to ``snapshot``, sources read at ``snap_id``."""

    frontier: str
    snapshot: str
    snap_id: str
    coord: psycopg.Connection


class DeltaReads(KeyPushdown):
    """Registers the reads of one refresh's plan (see the module docstring)."""

    def __init__(
        self,
        r: RefreshContext,
        st: StreamTable,
        window: Window,
        stored: StoredAggregate | None,
        timings: dict[str, float],
        shared: SharedReads | None = None,
    ) -> None:
        self.r = r
        self.st = st
        self.window = window
        self.stored = stored
        self.timings = timings
        self.conn = r.conn
        self._sources = {relation_key(s): s for s in st.sources}
        self.shared = shared
        """The batch's shared reads (``None``: a lone refresh, every read its own)."""
        relids = [*(s.relid for s in st.sources), st.relid]
        if shared is None:
            self._stats = jdbc.table_stats(window.coord, relids)
            self._buffer_cols = buffer_columns(self.conn, [s.relid for s in st.sources])
        else:
            self._stats = shared.stats(window.coord, relids)
            self._buffer_cols = shared.buffer_columns(self.conn, [s.relid for s in st.sources])
        self._keys: dict[KeySource, tuple[list[Any], bool] | None] = {}
        self._restrictions: Mapping[tuple[str, object], Restriction] = {}
        self._post_conditions: dict[str, str | None] = {}
        self._not_nulls: dict[int, frozenset[str]] = {}
        self.persisted: list[Any] = []
        self._read_columns: Mapping[str, frozenset[str]] = {}
        self.kept_views: Mapping[str, StateTable] = {}
        """Views of hidden state tables (set by the caller before :meth:`register`)."""
        self._registered: set[str] = set()
        self._provided: list[str] = []
        self._uses = 1
        """How many times the plan being registered reads the read being made."""
        self._small_reads = 0
        """How many times the plan being registered reads small tables whole (:func:`broadcasts`)."""
        self._once: list[Any] = []
        self._timings_lock = threading.Lock()

    def _columns(self, scan: ir.Scan, source: Source) -> list[str]:
        wanted = self._read_columns.get(scan.relation, frozenset()) | set(scan.source_columns)
        if self.shared is not None:
            wanted |= self.shared.columns.get(scan.relation, set())
        return [c for c, _ in source.column_types if c in wanted]

    def _compared(self, relation: str) -> list[str]:
        """The buffer columns of ``relation`` every read of its change carries (the columns any
        plan of this refresh, or of its batch, reads): an UPDATE that left all of them stored as
        they were is left out of its change and of its keys (:meth:`_unchanged_updates`)."""
        source = self._source(relation)
        wanted = set(self._read_columns.get(relation, frozenset()))
        if self.shared is not None:
            wanted |= self.shared.columns.get(relation, set())
        available = self._buffer_cols.get(source.relid, {})
        if any(c not in available for c in wanted):
            return []
        return [available[c] for c, _ in source.column_types if c in wanted]

    @staticmethod
    def _unchanged_updates(compared: Sequence[str]) -> sql.Composable:
        """`` AND NOT (<an UPDATE that changed none of the compared columns>)``, or nothing.

        Such an update's old and new rows are the same row over every column a read carries: in
        the change they cancel (the Z-set is the same without them), and the keys they would add
        bound no row the change needs. Left out, the touched keys — and the rows read by them —
        are those of real changes only (TPC-H: an order's priority update, which most queries do
        not read, no longer makes its lines read). The image comparison is the one the
        unread-updates rule uses (:func:`pgtrickle.cdc.buffers.images_equal`); ``compared``:
        :meth:`_compared`."""
        if not compared:
            return sql.SQL("")
        return sql.SQL(" AND NOT (action = 'U' AND {})").format(images_equal(compared))

    def register(
        self,
        compiled: Compiled,
        restrictions: Mapping[tuple[str, object], Restriction],
        read_columns: Mapping[str, frozenset[str]],
    ) -> None:
        """Register every read of ``compiled``; ``read_columns``: per relation, the source columns
        any Scan of the plan reads (the view of a relation holds them all)."""
        self._read_columns = read_columns
        self._restrictions = restrictions
        self._post_conditions = {}
        self._small_reads = sum(
            read.uses
            for read in compiled.reads
            if read.kind is ReadKind.POST
            and isinstance(read.node, ir.Scan)
            and read.node.relation in self._sources
            and (stats := self._stats.get(self._sources[read.node.relation].relid)) is not None
            and small(stats)
        )
        pending = []
        for read in compiled.reads:
            assert isinstance(read.name, str)
            if read.name in self._registered:
                continue
            if isinstance(read.node, ir.Materialized) and read.node.change:
                raise FallbackToFull("the plan reads a hidden table's change before it is computed")
            if read.kind is ReadKind.POST and read.name not in self.kept_views:
                assert isinstance(read.node, ir.Scan)
                if self._fed(read.node.relation) is not None:
                    raise NotChained(
                        f"its plan reads the contents of {read.node.relation}, which changes in the same batch"
                    )
            self._registered.add(read.name)
            pending.append(read)
        if self.shared is None and self.r.group is None and not capabilities(self.r.spark).connect:
            # A lone refresh's reads side by side (spark/overlap.py): their bounds first, on this
            # refresh's connection one after the other (each asked once, then the same text).
            for read in pending:
                if read.kind is ReadKind.POST and read.name not in self.kept_views:
                    assert isinstance(read.node, ir.Scan)
                    self.post_condition(read.node.relation)
            overlap.run_all([partial(self._register_one, read) for read in pending])
        else:
            for read in pending:
                self._register_one(read)

    def _register_one(self, read: Any) -> None:
        """Register one read of the plan as the view ``read.name`` (:meth:`register`)."""
        restrictions = self._restrictions
        # Read by _read only for a batch's shared reads, which register one after the other (never
        # side by side: register), so this per-read state is never shared between threads.
        self._uses = read.uses
        if read.name in self.kept_views:
            assert isinstance(read.node, ir.Materialized)
            df, bounded = self._kept_table(
                self.kept_views[read.name], restrictions.get(("materialized", read.node.node))
            )
        elif read.kind is ReadKind.DELTA:
            assert isinstance(read.node, ir.Scan)
            df = self._delta(read.node)
            bounded = True
        elif read.kind is ReadKind.POST:
            assert isinstance(read.node, ir.Scan)
            df, bounded = self._post(read.node)
        else:
            assert isinstance(read.node, ir.Materialized)
            df, bounded = self._state(read.node, restrictions.get(("materialized", read.node.node)))
        if self.shared is None and read.uses > 1 and bounded:
            df = df.persist()
            self.persisted.append(df)
        df.createOrReplaceTempView(read.name)

    def release(self) -> None:
        for df in self.persisted:
            df.unpersist()
        self.persisted.clear()
        for name in self._provided:
            self.r.spark.catalog.dropTempView(name)
        self._provided.clear()
        for leaf in self._once:
            planning.release(leaf)
        self._once.clear()

    # ------------------------------------------------------------ reads
    def _source(self, relation: str) -> Source:
        if relation not in self._sources:
            raise FallbackToFull(f"the query reads {relation}, which is not a recorded source")
        return self._sources[relation]

    def _post(self, scan: ir.Scan) -> tuple[Any, bool]:
        source = self._source(scan.relation)
        stats = self._stats[source.relid]
        restriction = self.post_restriction(scan.relation)
        condition = self.post_condition(scan.relation)
        group = self.r.group
        spark = self.r.spark
        snap_id = self.window.snap_id
        if condition is not None:
            query = f"SELECT {self.r.source_select(source) or '*'} FROM {source.qualified} WHERE {condition}"
            df = self._read(
                ("query", query, snap_id), lambda: jdbc.read_query(spark, self.r.target, query, snap_id), True
            )
            self._count("key_filtered_reads")
        else:
            parts = jdbc.partition_count(
                stats, self.r.settings.jdbc_partition_rows, capabilities(spark).parallelism
            )
            predicates = jdbc.ctid_predicates(stats, parts)
            select = self.r.source_select(source)
            df = self._read(
                ("table", source.qualified, snap_id, tuple(predicates), select),
                lambda: jdbc.read_table(
                    spark, self.r.target, source.qualified, snap_id, predicates, select=select
                ),
                False,
            )
            if broadcasts(stats, self._small_reads):
                # dvm/compile.py reads such a side inline, where Spark keeps the hint.
                df = df.hint("broadcast")
            self._count("whole_table_reads")
            self._add(ROWS_READ_WHOLE, stats.reltuples)
        df = df.selectExpr(*(spark_name(c) for c in self._columns(scan, source)))
        if group is not None and group.reads_from_group(source):
            df = self._after_group_change(scan, source, df, None if condition is None else restriction)
        return df, condition is not None

    def _after_group_change(
        self, scan: ir.Scan, source: Source, stored: Any, restriction: Restriction | None
    ) -> Any:
        """``post`` of an upstream member of an atomic group: its stored rows at S (``stored``,
        read at the group's snapshot, before this transaction changed them) ⊎ its change in this
        refresh - the rows it deleted taken out (EXCEPT ALL: multiset, NULL-safe), the rows it
        inserted added. The change's rows each weigh ±1 (one buffer row each)."""
        assert self.r.group is not None and self.r.group.changes is not None
        if self.r.group.changes.written(self.conn, source).rows == 0:
            return stored
        restrict = None
        if restriction is not None:
            # The stored rows were read for the change's keys only: so are the change's rows.
            rows = self._stats[source.relid].reltuples
            available = self._buffer_cols.get(source.relid, {})
            key = restriction.column
            # post_restriction bounds a group member's read by one column of its own keys only.
            assert isinstance(key, str)
            if key not in available:
                raise FallbackToFull(
                    f"the change buffer of {source.schema}.{source.name} does not carry column {key}"
                )

            def restrict(prefix: str) -> str:
                column = quote_ident(prefix + available[key])
                found = self._condition(restriction, rows, column)
                assert found is not None  # the same keys and sizes as the stored rows' read
                return found

        change = self._delta(scan, restrict)
        cols = [spark_name(c) for c in self._columns(scan, source)]
        deleted = change.where(f"{spark_name(WEIGHT)} < 0").selectExpr(*cols)
        inserted = change.where(f"{spark_name(WEIGHT)} > 0").selectExpr(*cols)
        self._count("group_member_reads")
        return stored.exceptAll(deleted).unionAll(inserted)

    def _state(self, node: ir.Materialized, restriction: Restriction | None) -> tuple[Any, bool]:
        stored = self.stored
        if stored is None or node.node is not stored.state:
            raise FallbackToFull("the plan reads a kept node without a hidden state table")
        stats = self._stats[self.st.relid]
        if restriction is not None:
            assert isinstance(restriction.column, str)  # a kept node's read: one column (dvm/keyed.py)
            restriction = Restriction(stored.stored_of(restriction.column), restriction.keys)
        condition = self._condition(restriction, stats.reltuples)
        if condition is None:
            self._add(ROWS_READ_WHOLE, stats.reltuples)
            condition = "true"
        select = ", ".join(f"{quote_ident(s)} AS {quote_ident(c)}" for c, s in stored.names)
        exact = self._exact_select(self.st.relid, self.st.schema, self.st.name, stored.written)
        query = f"SELECT {select} FROM (SELECT {exact} FROM {self.st.qualified} WHERE {condition}) AS __pgt_s"
        df = jdbc.read_query(self.r.spark, self.r.target, query, self.window.snap_id)
        self._count("stored_state_reads")
        return df, True

    def provide(self, name: str, df: Any, once: bool = False) -> None:
        """Register ``df`` as the view ``name`` (a hidden table's change, a sub-plan computed
        first); ``once``: ``df`` is a leaf of :func:`~pgtrickle.spark.planning.computed_once`,
        :meth:`release` frees its rows."""
        if once:
            self._once.append(df)
        df.createOrReplaceTempView(name)
        self._registered.add(name)
        self._provided.append(name)

    def _kept_table(self, table: StateTable, restriction: Restriction | None) -> tuple[Any, bool]:
        """A hidden state table as stored (the kept node's value at the window's start), only
        the rows of the change's keys when every plan reading it is bounded by them."""
        row = self.window.coord.execute(
            f"SELECT oid, {jdbc.ROW_ESTIMATE} FROM pg_class WHERE oid = %s::regclass", (table.qualified,)
        ).fetchone()
        assert row is not None
        relid, reltuples = int(row[0]), float(row[1])
        condition = None if restriction is None else self._condition(restriction, reltuples)
        exact = self._exact_select(relid, SCHEMA, table.name, table.columns)
        select = ", ".join(quote_ident(c) for c in table.columns)
        query = f"SELECT {select} FROM (SELECT {exact} FROM {table.qualified}"
        if condition is not None:
            query += f" WHERE {condition}"
            self._count("kept_key_filtered_reads")
        else:
            self._count("kept_state_reads")
            self._add(ROWS_READ_WHOLE, reltuples)
        query += ") AS __pgt_s"
        return jdbc.read_query(self.r.spark, self.r.target, query, self.window.snap_id), True

    def _exact_select(self, relid: int, schema: str, name: str, wanted: Sequence[str]) -> str:
        """The select list reading ``wanted`` columns of a table pgtrickle wrote (a stream table's
        stored state, a hidden state table) exactly, as a source is read (spark/carry.py): a
        time or numeric key must meet the change's keys with all its digits, and a
        ``character(n)`` value crosses without the blanks PostgreSQL padded it with on write."""
        keep = set(wanted)
        types = tuple((n, t) for n, t in column_types(self.conn, relid).items() if n in keep)
        own = Source(relid, schema, name, "STREAM_TABLE", "", column_types=types)
        return self.r.source_select(own) or "*"

    def _delta(self, scan: ir.Scan, restrict: Callable[[str], str] | None = None) -> Any:
        """``delta(scan)``; ``restrict``: the SQL condition bounding the rows of one side, given
        the side's column prefix (``new_`` / ``old_``)."""
        source = self._source(scan.relation)
        available = self._buffer_cols.get(source.relid, {})
        columns = self._columns(scan, source)
        missing = [c for c in columns if c not in available]
        if missing:
            raise FallbackToFull(
                f"the change buffer of {source.schema}.{source.name} does not carry column {missing[0]}"
            )
        fed = self._fed(scan.relation)
        bases = dict(self.r.carried_columns(source) or ())
        empty = self.shared is not None and (source.relid, self.window.frontier) in self.shared.empty_windows
        if fed is not None and restrict is None and empty:
            return self._with_fed(None, fed, source, columns, bases)  # nothing to read
        buffer, window = self._buffer(source, for_spark=True)
        frontiers = self.shared.frontiers.get(source.relid, []) if self.shared is not None else []
        windows: list[sql.Composable] = []
        flags: list[str] = []
        if len(frontiers) > 1 and self.window.frontier in frontiers:
            # Members of a batch at different frontiers share one read of the widest window, each
            # row flagged with the windows it belongs to (__pgt_in_<k>); each member keeps its own.
            windows = [window_predicate(f, self.window.snapshot) for f in frontiers]
            flags = [f"__pgt_in_{k}" for k in range(len(frontiers))]
            window = sql.SQL(" OR ").join(sql.SQL("({})").format(w) for w in windows)
        label = relation_key(source)
        compared = self._compared(scan.relation)
        if compared and not {available[c] for c in columns} <= set(compared):
            raise FallbackToFull(  # never expected: the compared columns are every column read
                f"the change of {source.schema}.{source.name} carries columns its keys do not compare"
            )
        unchanged = self._unchanged_updates(compared)

        def side(prefix: str, weight: int, actions: str) -> sql.Composed:
            select: list[sql.Composable] = [
                sql.SQL("{} AS {}").format(
                    carry.read_expression(sql.Identifier(prefix + available[c]), bases[c], f"{label}.{c}")
                    if c in bases
                    else sql.Identifier(prefix + available[c]),
                    sql.Identifier(c),
                )
                for c in columns
            ]
            select.append(sql.SQL("{}::bigint AS {}").format(sql.Literal(weight), sql.Identifier(WEIGHT)))
            select += [
                sql.SQL("{} AS {}").format(w, sql.Identifier(f)) for w, f in zip(windows, flags, strict=True)
            ]
            bound = sql.SQL("") if restrict is None else sql.SQL(" AND ") + sql.SQL(restrict(prefix))
            return sql.SQL("SELECT {} FROM {} WHERE ({}) AND action IN ({}){}{}").format(
                sql.SQL(", ").join(select), buffer, window, sql.SQL(actions), unchanged, bound
            )

        text = sql.SQL("{} UNION ALL {}").format(side("new_", 1, "'I', 'U'"), side("old_", -1, "'D', 'U'"))
        query = text.as_string(self.conn)
        df = self._read(
            ("query", query, None), lambda: jdbc.read_query(self.r.spark, self.r.target, query, None), True
        )
        if flags:
            mine = flags[frontiers.index(self.window.frontier)]
            df = df.where(spark_name(mine)).selectExpr(*(spark_name(c) for c in [*columns, WEIGHT]))
        if fed is None or restrict is not None:
            return df
        return self._with_fed(df, fed, source, columns, bases)

    def _fed(self, relation: str) -> Any:
        """The delta of the upstream member ``relation`` in the batch's job, if it is chained to it."""
        if self.shared is None or not self.shared.fed or relation not in self._sources:
            return None
        return self.shared.fed.get(self._sources[relation].relid)

    def _with_fed(
        self, df: Any, fed: Any, source: Source, columns: Sequence[str], bases: Mapping[str, str]
    ) -> Any:
        """``delta(scan)`` of an upstream member of the batch: its buffer's rows in the window
        (``df``; ``None``: the window holds none, nothing is read) ⊎ its delta in the same job
        (``fed``), where every column crosses exactly
        (:func:`~pgtrickle.refresh.chained.column_why_not`; NotChained otherwise)."""
        read_types = {} if df is None else {f.name: f.dataType.simpleString() for f in df.schema.fields}
        job_types = {f.name: f.dataType.simpleString() for f in fed.schema.fields}
        declared = dict(source.column_types)
        for c in columns:
            read_type = None if df is None else read_types.get(c, "absent")
            why = column_why_not(
                c, declared.get(c, "?"), _read_as_other(bases.get(c)), job_types.get(c, "absent"), read_type
            )
            if why is not None:
                raise NotChained(f"{source.schema}.{source.name}: {why}")
        self._count("chained_reads")
        change = fed.selectExpr(*(spark_name(c) for c in [*columns, WEIGHT]))
        return change if df is None else df.unionAll(change)

    def _read(self, key: tuple[Any, ...], make: Callable[[], Any], bounded: bool) -> Any:
        """A JDBC read: this refresh's own, or the batch's shared one (:class:`SharedReads`)."""
        if self.shared is None:
            return make()
        return self.shared.frame(key, make, bounded, self._uses)

    def _buffer(self, source: Source, for_spark: bool) -> tuple[sql.Composable, sql.Composable]:
        """The change buffer of ``source`` and the predicate of the window's rows in it.

        An upstream member of an atomic group: its change in this refresh, which the group's
        transaction wrote (refresh/group_changes.py) - for Spark, a committed copy of it.
        """
        group = self.r.group
        if group is not None and group.reads_from_group(source):
            assert group.changes is not None
            if for_spark:
                table = group.changes.staged(self.conn, self.r.staging_conn, source)
                return table, group.changes.predicate()
            return sql.Identifier("pgtrickle_changes", source.buffer_name), group.changes.predicate()
        buffer = sql.Identifier("pgtrickle_changes", source.buffer_name)
        return buffer, window_predicate(self.window.frontier, self.window.snapshot)

    def _count(self, what: str) -> None:
        self._add(what, 1)

    def _add(self, what: str, value: float) -> None:
        with self._timings_lock:  # reads registered side by side (register) count here too
            self.timings[what] = self.timings.get(what, 0) + value
