"""DIFFERENTIAL refresh: compute the change of the result on Spark, merge it in PostgreSQL.

1. A coordinator transaction exports snapshot S2; with WAL capture the
   decoder is waited for until it has passed S2. The window (frontier, S2]
   is counted again (the plan's counts are from an earlier snapshot).
2. Spark views: for every changed source its *delta* (the buffer rows of the
   window as a Z-set: new values weighted +1, old values −1, read at a fresh
   snapshot with the window as an explicit predicate), and for every other
   table occurrence its *state after* the window (read at S2). When an
   occurrence is equi-joined to a changed one and is large, only the rows
   with the keys the delta holds are read (the predicate runs in
   PostgreSQL).
3. One Spark job evaluates the delta query (:mod:`pgtrickle.dvm.linear`):
   consolidated rows with net weights for a linear query, per-group state
   changes for an aggregate. A rescan aggregate (MIN/MAX, HAVING, …) runs a
   second job recomputing only the groups the first one found.
4. One PostgreSQL transaction merges the delta (explicit DELETE / UPDATE /
   INSERT), records it in the stream table's own change buffer for
   downstream stream tables, advances the frontier and completes the history
   row. A delta that does not match the table (it never should) aborts the
   transaction and the engine refreshes in full instead.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import psycopg
from psycopg import sql
from sqlglot import exp

from pgtrickle import faults
from pgtrickle.catalog.store import Source, StreamTable
from pgtrickle.cdc.buffers import PendingChanges, pending_changes, rows_table
from pgtrickle.cdc.wal import wait_for_decoder
from pgtrickle.db.query import one_row, scalar
from pgtrickle.dvm import aggregate as agg_rules
from pgtrickle.dvm.aggregate import DELTA_TABLE, KEYS_TABLE, ROW_ID
from pgtrickle.dvm.analysis import COUNT_COLUMN, RESCAN, AggregateShape, Analysis, LinearShape, RecomputeShape
from pgtrickle.dvm.apply import linear_statements
from pgtrickle.dvm.layout import Layout
from pgtrickle.dvm.linear import (
    WEIGHT,
    NotDifferentiable,
    Weighted,
    bind_views,
    conjuncts,
    equi_links,
    from_items,
    strip_parens,
    term_occurrences,
    term_query,
    terms,
    weighted,
)
from pgtrickle.dvm.partitioned import PartitionedShape
from pgtrickle.errors import PgTrickleError, UnsupportedQueryError
from pgtrickle.refresh import commit, history, user_triggers
from pgtrickle.refresh.context import RefreshContext
from pgtrickle.refresh.layout_ddl import equality_operators
from pgtrickle.spark import carry, jdbc
from pgtrickle.spark.capabilities import capabilities, tag_jobs
from pgtrickle.sql.ident import quote_ident
from pgtrickle.sql.translate import translate_to_spark

RAW_TABLE = "pg_temp.__pgt_raw"

PUSHDOWN_MIN_ROWS = 10_000
"""Tables smaller than this are read whole: a key filter would not pay for itself."""
PUSHDOWN_MAX_KEYS = 100_000
BROADCAST_MAX_BYTES = 10 * 1024 * 1024
"""Whole tables read for a join up to this size (by relpages) are broadcast to the delta's side."""
COPY_MAX_ROWS = 200_000
"""Deltas up to this many rows are collected and COPYed; larger ones go by partitioned JDBC."""


class FallbackToFull(PgTrickleError):
    """This refresh cannot run differentially; the message says why (it runs FULL instead)."""


def should_push_down(table_rows: float, key_count: int) -> bool:
    """Read only the rows matching the delta's keys? (pure)"""
    return table_rows >= PUSHDOWN_MIN_ROWS and key_count <= PUSHDOWN_MAX_KEYS and key_count * 4 < table_rows


def window_predicate(frontier: str, upto: str) -> sql.Composed:
    return sql.SQL(
        "xid >= pg_snapshot_xmin({f}::pg_snapshot) AND NOT pg_visible_in_snapshot(xid, {f}::pg_snapshot)"
        " AND pg_visible_in_snapshot(xid, {u}::pg_snapshot)"
    ).format(f=sql.Literal(frontier), u=sql.Literal(upto))


@dataclass
class Staged:
    """A delta written by Spark into an unlogged staging table."""

    table: str
    columns: list[str]


@dataclass
class DeltaResult:
    """What the Spark side hands to the apply: the delta rows, and the touched group keys of a rescan."""

    rows: list[tuple] | Staged
    keys: list[tuple] | Staged = field(default_factory=list)
    replaces: bool = False
    """``rows`` are the whole new result (a recompute): the apply subtracts the table's rows."""


class DifferentialRun:
    """One differential refresh of one stream table (used by the engine)."""

    def __init__(
        self, refresher: RefreshContext, st: StreamTable, analysis: Analysis, layout: Layout
    ) -> None:
        self.r = refresher
        self.st = st
        self.analysis = analysis
        self.layout = layout
        self.conn: psycopg.Connection = refresher.conn
        self.prefix = f"pgt_{st.pgt_id}_"
        self.timings: dict[str, float] = {}
        self.recompute_reason = ""
        """Set when this run recomputed the whole query (and why)."""

    # ---------------------------------------------------------------- main
    def run(self, history_id: int, request_ids: Sequence[int]) -> tuple[int, int, int, float]:
        """Returns (inserted, deleted, delta rows, spark seconds)."""
        st = self.st
        coordinator, snap_id, snapshot, lsn = self.r.coordinator(st.sources)
        with coordinator as coord:
            if self.r.group is None and (
                any(s.kind == "TABLE" and s.cdc_mode == "wal" for s in st.sources)
                or history.wal_capture_set_up(self.conn)
            ):
                wait_for_decoder(self.conn, self.r.dsn)
            assert st.frontier is not None
            pending = pending_changes(self.conn, st.sources, st.frontier, snapshot)
            truncated = [p.source for p in pending if p.truncated]
            if truncated:
                raise FallbackToFull(
                    f"source {truncated[0].schema}.{truncated[0].name} was truncated or refreshed in full"
                )
            changed = {p.source.relid: p for p in pending if p.rows > 0}
            t0 = time.monotonic()
            if changed:
                faults.point("refresh.spark_job")
                try:
                    with carry.refusals_checked(lambda: self.r.spark, coord):
                        result = self._compute(coord, snap_id, snapshot, changed)
                except Exception as exc:
                    refused = carry.refusal_in(exc)
                    if refused is None:
                        self._demote_if_plan_fails(exc)
                        raise
                    # A change in the window (say, a row inserted and deleted again) holds a value
                    # Spark cannot carry: the sources at the new snapshot may not, so recompute;
                    # if they still do, the FULL refresh refuses it in turn.
                    raise FallbackToFull(
                        f"a change holds a value Spark cannot carry ({refused.message})"
                    ) from exc
            else:
                result = DeltaResult([])
            spark_seconds = time.monotonic() - t0
            if self.r.group is None:
                coord.rollback()
        self.r.check_cancel()
        t1 = time.monotonic()
        try:
            inserted, deleted = self._apply(
                result, history_id, self.r.commit_snapshot(snapshot), lsn, request_ids, spark_seconds
            )
        finally:
            self._drop_staging(result)
        self.timings["apply"] = time.monotonic() - t1
        self.timings["spark_job"] = spark_seconds
        return inserted, deleted, sum(p.rows for p in changed.values()), spark_seconds

    def _demote_if_plan_fails(self, exc: BaseException) -> None:
        """AUTO never settles on a differential plan Spark refuses: refresh FULL from now on, saying why.

        A delta query Spark cannot analyse (or pgtrickle cannot translate)
        fails the same way at every refresh; the query itself ran at the
        initial FULL. So an ``AUTO`` stream table runs FULL now and is
        analysed FULL (with this reason) until the daemon restarts; with
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
    def _compute(
        self, coord: psycopg.Connection, snap_id: str, snapshot: str, changed: dict[int, PendingChanges]
    ) -> DeltaResult:
        spark = self.r.spark
        tag_jobs(spark, f"pgtrickle-{self.st.pgt_id}", f"refresh {self.st.display}")
        self._snap_id, self._snapshot, self._coord = snap_id, snapshot, coord
        self._stats = jdbc.table_stats(coord, [s.relid for s in self.st.sources])
        self._buffer_cols = _buffer_columns(self.conn, [s.relid for s in self.st.sources])
        self._views: dict[tuple, str] = {}
        self._column_types: dict[tuple[str, str], dict[str, str]] = {}
        shape = self.analysis.shape
        total = sum(p.rows for p in changed.values())
        partitions = max(1, min(capabilities(spark).parallelism, 1 + total // 50_000))
        # Size the shuffle to the delta, not to the sources; small deltas skip AQE's re-planning.
        tuned = {
            "spark.sql.shuffle.partitions": str(partitions),
            "spark.sql.adaptive.enabled": "false" if total < 100_000 else "true",
        }
        saved = {key: spark.conf.get(key) for key in tuned}
        for key, value in tuned.items():
            spark.conf.set(key, value)
        try:
            if isinstance(shape, LinearShape):
                return self._linear(shape, changed)
            if isinstance(shape, PartitionedShape):
                return self._partitioned(shape, changed)
            if isinstance(shape, RecomputeShape):
                return self._recompute(shape.construct)
            assert isinstance(shape, AggregateShape)
            if shape.strategy == RESCAN:
                return self._rescan(shape, changed)
            return self._algebraic(shape, changed)
        finally:
            for key, old in saved.items():
                if old is None:
                    spark.conf.unset(key)
                else:
                    spark.conf.set(key, old)

    def _source(self, schema: str, table: str) -> Source:
        for source in self.st.sources:
            if source.schema == schema and source.name == table:
                return source
        raise FallbackToFull(f"the query reads {schema}.{table}, which is not a recorded source")

    def _delta_sql(
        self, template: Weighted, changed: dict[int, PendingChanges], names: Sequence[str]
    ) -> str | None:
        """Spark SQL of every inclusion–exclusion term, signed, as columns ``names`` + ``__pgt_w``.

        Composed as text so that one ``spark.sql`` call builds the whole job
        (each DataFrame operation is a round trip to the JVM). Translations
        are cached per term and view names across refreshes.
        """
        occ_source = {o.index: self._source(o.schema, o.table) for o in template.occurrences}
        changed_occ = {i for i, s in occ_source.items() if s.relid in changed}
        links = equi_links(template)
        try:
            all_terms = terms(template, changed_occ)
        except NotDifferentiable as err:
            raise FallbackToFull(str(err)) from err
        columns = ", ".join(spark_name(n) for n in [*names, WEIGHT])
        parts = []
        for deltas, sign in all_terms:
            views = {}
            read = self.r.cached(
                ("term-occurrences", self.st.pgt_id, self.st.normalized_query, id(template), deltas),
                partial(term_occurrences, template, deltas),
            )
            for index, source in occ_source.items():
                if index not in read:
                    continue
                if index in deltas:
                    views[(index, True)] = self._delta_view(source)
                else:
                    views[(index, False)] = self._post_view(source, index, deltas, occ_source, links)
            spark_sql = self._translated(
                ("term", id(template.query), deltas, tuple(sorted(views.items()))),
                partial(term_query, template, deltas, views),
            )
            if spark_sql is None:
                continue
            outer = ", ".join(spark_name(n) for n in names)
            parts.append(
                f"SELECT {outer}, {'-' if sign < 0 else ''}{WEIGHT} AS {WEIGHT} "
                f"FROM ({spark_sql}) AS __pgt_t({columns})"
            )
        if not parts:
            return None
        return "\nUNION ALL\n".join(parts)

    def _translated(self, key: tuple, build) -> str | None:
        """Spark SQL of the PostgreSQL query ``build()`` returns over ``pgt_dvm`` views (cached)."""
        cache = self.r.dvm_cache
        full_key = (self.st.pgt_id, self.st.normalized_query, *key)
        if full_key not in cache:
            query = build()
            if query is None:
                cache[full_key] = None
            else:
                views = sorted({t.name for t in query.find_all(exp.Table) if t.text("db") == "pgt_dvm"})
                cache[full_key] = translate_to_spark(
                    query.sql("postgres"),
                    {("pgt_dvm", v): v for v in views},
                    {("pgt_dvm", v): self._column_types[("pgt_dvm", v)] for v in views},
                )
        translated = cache[full_key]
        assert translated is None or isinstance(translated, str)
        return translated

    def _delta_view(self, source: Source) -> str:
        key = ("delta", source.relid)
        if key in self._views:
            return self._views[key]
        name = f"{self.prefix}d_{source.relid}"
        cols = self._columns_of(source)
        available = self._buffer_cols.get(source.relid, {})
        # A stream table created before its buffer carried columns (older catalog) has none.
        missing = (
            [c for c in source.columns_used if c not in available] if source.kind == "STREAM_TABLE" else []
        )
        if missing:
            raise FallbackToFull(
                f"the change buffer of {source.schema}.{source.name} does not carry column {missing[0]}"
            )
        buffer = sql.SQL("pgtrickle_changes.{}").format(sql.Identifier(source.buffer_name))
        win = window_predicate(self.st.frontier or "", self._snapshot)

        bases = dict(self.r.carried_columns(source) or ())
        label = f"{source.schema}.{source.name}"

        def side(prefix: str, weight: int, actions: str) -> sql.Composed:
            select = [
                sql.SQL("{} AS {}").format(
                    carry.read_expression(sql.Identifier(prefix + available[c]), bases[c], f"{label}.{c}")
                    if c in bases
                    else sql.Identifier(prefix + available[c]),
                    sql.Identifier(c),
                )
                for c in cols
            ]
            select.append(sql.SQL("{}::bigint AS {}").format(sql.Literal(weight), sql.Identifier(WEIGHT)))
            return sql.SQL("SELECT {} FROM {} WHERE {} AND action IN ({})").format(
                sql.SQL(", ").join(select), buffer, win, sql.SQL(actions)
            )

        query = sql.SQL("{} UNION ALL {}").format(side("new_", 1, "'I', 'U'"), side("old_", -1, "'D', 'U'"))
        df = jdbc.read_query(self.r.spark, self.r.target, query.as_string(self.conn), None)
        df.createOrReplaceTempView(name)
        self._register(name, source, cols)
        self._views[key] = name
        return name

    def _columns_of(self, source: Source) -> list[str]:
        """The source's columns its change buffer carries (every column a stream table reads, by current name)."""
        captured = self._buffer_cols.get(source.relid, {})
        return [n for n, _ in source.column_types if n in captured]

    def _register(self, name: str, source: Source, cols: list[str]) -> None:
        types = dict(source.column_types)
        mapping = {c: types[c] for c in cols if c in types}
        mapping[WEIGHT] = "bigint"
        self._column_types[("pgt_dvm", name)] = mapping

    def _post_view(
        self, source: Source, index: int, deltas: frozenset[int], occ_source: dict[int, Source], links
    ) -> str:
        stats = self._stats[source.relid]
        for link in links.get(index, []):
            if link.other not in deltas:
                continue
            other = occ_source[link.other]
            keys = self._delta_keys(other, link.other_column)
            if keys is None or not should_push_down(stats.reltuples, len(keys)):
                continue
            filtered_key = ("post", source.relid, link.column, other.relid, link.other_column)
            if filtered_key in self._views:
                return self._views[filtered_key]
            name = self.r.view_name(self.st.pgt_id, filtered_key)
            other_type = dict(other.column_types)[link.other_column]
            condition = self._key_condition(link.column, other_type, keys, with_null=False)
            df = jdbc.read_query(
                self.r.spark, self.r.target, self._select_from(source, condition), self._snap_id
            )
            self.timings["key_filtered_reads"] = self.timings.get("key_filtered_reads", 0) + 1
            self._finish_post(df, name, source)
            self._views[filtered_key] = name
            return name
        key = ("post", source.relid)
        if key in self._views:
            return self._views[key]
        name = f"{self.prefix}p_{source.relid}"
        parts = jdbc.partition_count(
            stats, self.r.settings.jdbc_partition_rows, capabilities(self.r.spark).parallelism
        )
        df = jdbc.read_table(
            self.r.spark,
            self.r.target,
            source.qualified,
            self._snap_id,
            jdbc.ctid_predicates(stats, parts),
            select=self.r.source_select(source),
        )
        if stats.relpages * 8192 <= BROADCAST_MAX_BYTES:
            # Spark cannot size a JDBC relation: say it is small, so the join with the delta
            # broadcasts it instead of shuffling both sides.
            df = df.hint("broadcast")
        self.timings["whole_table_reads"] = self.timings.get("whole_table_reads", 0) + 1
        self._finish_post(df, name, source)
        self._views[key] = name
        return name

    def _select_from(self, source: Source, condition: str) -> str:
        """The rows of ``source`` meeting ``condition``, every column read exactly (spark/carry.py)."""
        return f"SELECT {self.r.source_select(source) or '*'} FROM {source.qualified} WHERE {condition}"

    def _finish_post(self, df, name: str, source: Source) -> None:
        """Register a state read as view ``name``: the columns read, each row weighted 1."""
        cols = self._columns_of(source)
        df.createOrReplaceTempView(f"{name}_raw")
        select = ", ".join(spark_name(c) for c in cols)
        self.r.spark.sql(
            f"CREATE OR REPLACE TEMP VIEW {name} AS "
            f"SELECT {select}{', ' if select else ''}CAST(1 AS BIGINT) AS {WEIGHT} FROM {name}_raw"
        )
        self._register(name, source, cols)

    def _delta_keys(self, source: Source, column: str) -> list | None:
        """Distinct non-null values of ``column`` in the window's changes of ``source`` (None: too many)."""
        cache = self.__dict__.setdefault("_key_cache", {})
        if (source.relid, column) in cache:
            return cache[(source.relid, column)]
        buf = self._buffer_cols.get(source.relid, {}).get(column)
        if buf is None:
            return None
        win = window_predicate(self.st.frontier or "", self._snapshot)
        rows = self.conn.execute(
            sql.SQL(
                "SELECT DISTINCT v FROM (SELECT {n} AS v FROM pgtrickle_changes.{b} WHERE {w} AND action IN ('I','U')"
                " UNION ALL SELECT {o} FROM pgtrickle_changes.{b} WHERE {w} AND action IN ('D','U')) s"
                " WHERE v IS NOT NULL LIMIT {lim}"
            ).format(
                n=sql.Identifier("new_" + buf),
                o=sql.Identifier("old_" + buf),
                b=sql.Identifier(source.buffer_name),
                w=win,
                lim=sql.Literal(PUSHDOWN_MAX_KEYS + 1),
            )
        ).fetchall()
        keys = None if len(rows) > PUSHDOWN_MAX_KEYS else [r[0] for r in rows]
        cache[(source.relid, column)] = keys
        return keys

    # ------------------------------------------------------- shape rules
    def _collect(self, spark_sql: str) -> list[tuple] | Staged:
        """Run the job. Small results come back to the driver (then COPY); large ones go by JDBC."""
        df = self.r.spark.sql(spark_sql)
        rows = df.limit(COPY_MAX_ROWS + 1).collect()
        if len(rows) <= COPY_MAX_ROWS:
            return [tuple(r) for r in rows]
        del rows
        return self._stage(df)

    def _output(
        self,
        source_sql: str,
        names: Sequence[str],
        pg_types: Sequence[str],
        hash_positions: Sequence[int],
        extra: Sequence[str] = (),
    ) -> str:
        """SELECT c0.. (timestamps rendered for COPY), ``extra`` columns and ``__pgt_row_id``.

        ``source_sql`` must expose ``names`` then ``extra``. The row identity
        is xxhash64 of the columns at ``hash_positions``, exactly as a FULL
        refresh computes it (:func:`finish_output`).
        """
        cols = [
            _for_copy(spark_name(n), t) + f" AS c{i}"
            for i, (n, t) in enumerate(zip(names, pg_types, strict=True))
        ]
        cols += [spark_name(e) for e in extra]
        row_id = (
            f"xxhash64({', '.join(spark_name(names[i]) for i in hash_positions)})"
            if hash_positions
            else "CAST(0 AS BIGINT)"
        )
        return f"SELECT {', '.join(cols)}, {row_id} AS {ROW_ID} FROM ({source_sql}) AS __pgt_o"

    def _stage(self, df) -> Staged:
        """Write a large delta by partitioned JDBC into an unlogged staging table."""
        stored = self._stored_types()
        name = f"delta_{self.st.pgt_id}"
        table = sql.SQL("pgtrickle_changes.{}").format(sql.Identifier(name))
        target_cols = self._target_columns(df.columns)
        cols = [
            sql.SQL("{} {}").format(sql.Identifier(df_col), sql.SQL(stored.get(t, "bigint")))
            for df_col, t in zip(df.columns, target_cols, strict=True)
        ]
        with self.r.staging_conn() as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
            conn.execute(sql.SQL("CREATE UNLOGGED TABLE {} ({})").format(table, sql.SQL(", ").join(cols)))
        self.r.progress(f"{self.st.display}: large delta: writing it by JDBC into a staging table")
        jdbc.write_append(df, self.r.target, f'pgtrickle_changes."{name}"')
        return Staged(f"pgtrickle_changes.{quote_ident(name)}", list(df.columns))

    def _stored_types(self) -> dict[str, str]:
        return dict(
            self.conn.execute(
                "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute"
                " WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped",
                (self.st.relid,),
            ).fetchall()
        )

    def _target_columns(self, df_columns: Sequence[str]) -> list[str]:
        """The stream-table column each delta column (c0.., then named ones) stands for."""
        shape = self.analysis.shape
        if isinstance(shape, (LinearShape, PartitionedShape, RecomputeShape)):
            data = [c.name for c in self.st.columns]
        elif isinstance(shape, AggregateShape) and shape.strategy != RESCAN:
            data = [k.column for k in shape.keys]
        else:
            data = list(self.layout.columns)
        return [data[int(c[1:])] if c.startswith("c") and c[1:].isdigit() else c for c in df_columns]

    def _visible_types(self) -> list[str]:
        return [c.type for c in self.st.columns]

    def _linear(self, shape: LinearShape, changed: dict[int, PendingChanges]) -> DeltaResult:
        template = self.r.cached(
            ("weighted", self.st.pgt_id, self.st.normalized_query), lambda: weighted(shape.query)
        )
        names = [f"__pgt_c{i}" for i in range(len(self.st.columns))]
        delta = self._delta_sql(template, changed, names)
        if delta is None:
            return DeltaResult([])
        # Consolidation (rows that cancel) happens in PostgreSQL, on the way in.
        out = self._output(delta, names, self._visible_types(), list(range(len(names))), extra=[WEIGHT])
        return DeltaResult(self._collect(out))

    def _partitioned(self, shape: PartitionedShape, changed: dict[int, PendingChanges]) -> DeltaResult:
        """Q(state after | K) − Q(state before | K) over the join keys K the changes touch."""
        keys: set = set()
        with_null = False
        for keyed in shape.occurrences:
            source = self._source(keyed.occurrence.schema, keyed.occurrence.table)
            if source.relid not in changed:
                continue
            found = self._delta_keys(source, keyed.key_column)
            if found is None:
                raise FallbackToFull(f"the changes touch more than {PUSHDOWN_MAX_KEYS:,} join keys")
            keys.update(found)
            with_null = with_null or self._delta_has_null(source, keyed.key_column)
        if shape.not_in:
            why = self._not_in_is_global(shape, changed, with_null)
            if why:
                return self._recompute(why)
        if not keys and not with_null:
            return DeltaResult([])
        post_views: dict[int, str] = {}
        pre_views: dict[int, str] = {}
        for keyed in shape.occurrences:
            index = keyed.occurrence.index
            source = self._source(keyed.occurrence.schema, keyed.occurrence.table)
            post, pre = self._keyed_states(
                source,
                index,
                keyed.key_column,
                sorted(keys),
                with_null or keyed.null_sensitive,
                source.relid in changed,
            )
            post_views[index] = post
            pre_views[index] = pre
        names = [f"__pgt_c{i}" for i in range(len(self.st.columns))]
        columns = ", ".join(spark_name(n) for n in names)
        parts = []
        for label, views, weight in (("after", post_views, 1), ("before", pre_views, -1)):
            spark_sql = self._translated(
                ("keyed", label, tuple(sorted(views.items()))),
                lambda views=views: bind_views(shape.query.copy(), views),
            )
            parts.append(
                f"SELECT {columns}, CAST({weight} AS BIGINT) AS {WEIGHT} "
                f"FROM ({spark_sql}) AS __pgt_t({columns})"
            )
        out = self._output(
            "\nUNION ALL\n".join(parts), names, self._visible_types(), list(range(len(names))), extra=[WEIGHT]
        )
        return DeltaResult(self._collect(out))

    def _not_in_is_global(
        self, shape: PartitionedShape, changed: dict[int, PendingChanges], with_null: bool
    ) -> str:
        """Why this change can affect every key of a NOT IN query ('' when keyed recompute is exact).

        ``x NOT IN (S)`` is unknown for every x once S holds a NULL, and true for
        every x (NULL included) while S is empty: a NULL key in the change, or S
        possibly becoming empty or non-empty, reaches beyond the touched keys.
        """
        if with_null:
            return "NOT IN (subquery) with a NULL key in the changes"
        for sub in shape.not_in:
            sources = [
                self._source(shape.occurrences[i].occurrence.schema, shape.occurrences[i].occurrence.table)
                for i in sub.occurrences
            ]
            touched = [changed[s.relid].rows for s in sources if s.relid in changed]
            if not touched:
                continue
            # S had at least (rows now − rows inserted) rows before: non-empty on both sides if that is > 0.
            inserted = sum(touched)
            now = self._coord.execute(
                f"SELECT count(*) FROM ({sub.sql} LIMIT {inserted + 1}) AS s"
            ).fetchone()
            if now is None or int(now[0]) <= inserted:
                return "NOT IN (subquery) whose subquery may have become empty or non-empty"
        return ""

    def _recompute(self, why: str) -> DeltaResult:
        """The whole query over the sources after the window; :meth:`_apply` subtracts the table."""
        self.timings["recompute"] = 1
        self.recompute_reason = why
        table_map: dict[tuple[str, str], str] = {}
        column_types: dict[tuple[str, str], dict[str, str]] = {}
        for source in self.st.sources:
            view = self._post_view(source, -1, frozenset(), {}, {})
            table_map[(source.schema, source.name)] = view
            column_types[(source.schema, source.name)] = self._column_types[("pgt_dvm", view)]
        cache = self.r.dvm_cache
        key = (self.st.pgt_id, self.st.normalized_query, "recompute", tuple(sorted(table_map.items())))
        if key not in cache:
            cache[key] = translate_to_spark(self.st.normalized_query, table_map, column_types)
        names = [f"__pgt_c{i}" for i in range(len(self.st.columns))]
        inner = (
            f"SELECT *, CAST(1 AS BIGINT) AS {WEIGHT} "
            f"FROM ({cache[key]}) AS __pgt_s({', '.join(spark_name(n) for n in names)})"
        )
        out = self._output(inner, names, self._visible_types(), list(range(len(names))), extra=[WEIGHT])
        return DeltaResult(self._collect(out), keys=[()], replaces=True)

    def _keyed_states(
        self, source: Source, index: int, column: str, keys: list, with_null: bool, changed: bool
    ) -> tuple[str, str]:
        """Views of ``source`` restricted to the keys: after the window, and before it (after − delta)."""
        cols = self._columns_of(source)
        condition = self._key_condition(column, dict(source.column_types)[column], keys, with_null)
        post_df = jdbc.read_query(
            self.r.spark, self.r.target, self._select_from(source, condition), self._snap_id
        )
        post = f"{self.prefix}k{index}_{source.relid}"
        post_df.createOrReplaceTempView(f"{post}_raw")
        select = ", ".join(spark_name(c) for c in cols)
        self.r.spark.sql(f"CREATE OR REPLACE TEMP VIEW {post} AS SELECT {select} FROM {post}_raw")
        self._register(post, source, cols)
        self.timings["key_filtered_reads"] = self.timings.get("key_filtered_reads", 0) + 1
        if not changed:
            return post, post
        delta = self._delta_view(source)
        pre = f"{self.prefix}b{index}_{source.relid}"
        self.r.spark.sql(
            f"CREATE OR REPLACE TEMP VIEW {pre} AS SELECT {select} FROM ("
            f"SELECT {select}{', ' if select else ''}SUM({WEIGHT}) AS {WEIGHT} FROM ("
            f"SELECT {select}{', ' if select else ''}CAST(1 AS BIGINT) AS {WEIGHT} FROM {post} UNION ALL "
            f"SELECT {select}{', ' if select else ''}-{WEIGHT} FROM {delta}) AS __pgt_u"
            f"{' GROUP BY ' + select if select else ''}) AS __pgt_n "
            f"LATERAL VIEW explode(array_repeat(1, CAST(__pgt_n.{WEIGHT} AS INT))) __pgt_e AS __pgt_copy "
            f"WHERE __pgt_n.{WEIGHT} > 0"
        )
        self._register(pre, source, cols)
        return post, pre

    def _key_condition(self, column: str, col_type: str, values: Sequence, with_null: bool) -> str:
        """``column = ANY(values)`` (and ``OR column IS NULL``) as PostgreSQL text, pushed into a JDBC read."""
        literal = sql.Literal(list(values)).as_string(self.conn)
        condition = f"{quote_ident(column)} = ANY(CAST({literal} AS {col_type}[]))"
        return f"({condition} OR {quote_ident(column)} IS NULL)" if with_null else condition

    def _delta_has_null(self, source: Source, column: str) -> bool:
        buf = self._buffer_cols.get(source.relid, {}).get(column)
        if buf is None:
            return True
        win = window_predicate(self.st.frontier or "", self._snapshot)
        row = self.conn.execute(
            sql.SQL(
                "SELECT EXISTS (SELECT 1 FROM pgtrickle_changes.{b} WHERE {w} AND ("
                "(action IN ('I','U') AND {n} IS NULL) OR (action IN ('D','U') AND {o} IS NULL)))"
            ).format(
                b=sql.Identifier(source.buffer_name),
                w=win,
                n=sql.Identifier("new_" + buf),
                o=sql.Identifier("old_" + buf),
            )
        ).fetchone()
        return bool(row and row[0])

    def _core_delta(
        self, shape: AggregateShape, changed: dict[int, PendingChanges]
    ) -> tuple[str | None, list[str]]:
        core = self.r.cached(
            ("core", self.st.pgt_id, self.st.normalized_query), lambda: weighted(agg_rules.core_query(shape))
        )
        names = [e.alias_or_name for e in core.query.expressions][:-1]
        return self._delta_sql(core, changed, names), names

    def _key_types(self, shape: AggregateShape) -> list[str]:
        stored = self.r.cached(("stored", self.st.pgt_id, self.layout.columns), self._stored_types)
        return [stored.get(k.column, "") for k in shape.keys]

    def _algebraic(self, shape: AggregateShape, changed: dict[int, PendingChanges]) -> DeltaResult:
        delta, _ = self._core_delta(shape, changed)
        if delta is None:
            return DeltaResult([])
        w = WEIGHT
        states: dict[str, str] = {COUNT_COLUMN: f"SUM({w})"}
        decimals = _decimal_columns(self.r.spark.sql(delta))
        for spec in shape.aggs:
            conds = []
            if spec.filter is not None:
                conds.append(f"coalesce({spark_name(agg_rules.filter_arg(spec.index))}, false)")
            if spec.arg is not None:
                x = spark_name(agg_rules.value_arg(spec.index))
                conds.append(f"{x} IS NOT NULL")
            cond = " AND ".join(conds) or "true"
            if spec.kind in ("sum", "avg"):
                weighted = _weighted(x, w) if agg_rules.value_arg(spec.index) in decimals else f"{x} * {w}"
                states[spec.sum_column] = f"SUM(CASE WHEN {cond} THEN {weighted} END)"
                states[spec.count_column] = f"SUM(CASE WHEN {cond} THEN {w} ELSE 0 END)"
            elif spec.kind in ("count", "count_star"):
                states[spec.count_column] = f"SUM(CASE WHEN {cond} THEN {w} ELSE 0 END)"
        hidden = [c for c in shape.hidden_columns() if c in states]
        keys = [spark_name(agg_rules.key_arg(k.index)) for k in shape.keys]
        if shape.scalar:
            select = [
                f"coalesce({states[c]}, 0) AS {spark_name(c)}"
                if not c.endswith("_sum")
                else f"{states[c]} AS {spark_name(c)}"
                for c in hidden
            ]
            grouped = f"SELECT {', '.join(select)} FROM ({delta}) AS __pgt_d"
        else:
            select = [*keys, *[f"{states[c]} AS {spark_name(c)}" for c in hidden]]
            # A group whose rows came and went inside the window changes nothing.
            changes = " OR ".join(f"coalesce({states[c]} <> 0, false)" for c in hidden)
            grouped = (
                f"SELECT {', '.join(select)} FROM ({delta}) AS __pgt_d "
                f"GROUP BY {', '.join(keys)} HAVING {changes}"
            )
        key_names = [agg_rules.key_arg(k.index) for k in shape.keys]
        out = self._output(
            grouped, key_names, self._key_types(shape), list(range(len(key_names))), extra=hidden
        )
        return DeltaResult(self._collect(out))

    def _rescan(self, shape: AggregateShape, changed: dict[int, PendingChanges]) -> DeltaResult:
        delta, _ = self._core_delta(shape, changed)
        if delta is None:
            return DeltaResult([])
        key_names = [agg_rules.key_arg(k.index) for k in shape.keys]
        keys_view = f"{self.prefix}keys"
        if key_names:
            self.r.spark.sql(
                f"CREATE OR REPLACE TEMP VIEW {keys_view} AS SELECT DISTINCT "
                f"{', '.join(spark_name(k) for k in key_names)} FROM ({delta}) AS __pgt_d"
            )
            keys = self._collect(
                self._output(
                    f"SELECT * FROM {keys_view}",
                    key_names,
                    [""] * len(key_names),
                    list(range(len(key_names))),
                )
            )
        else:
            keys = self._collect(f"SELECT 1 FROM ({delta}) AS __pgt_d LIMIT 1")
        if isinstance(keys, Staged):
            self.conn.execute(f"DROP TABLE IF EXISTS {keys.table}")
            raise FallbackToFull(f"the changes touch more than {COPY_MAX_ROWS:,} groups")
        if not keys:
            return DeltaResult([], [])
        self._column_types[("pgt_dvm", keys_view)] = {}
        pushed = self._rescan_pushdown(shape, keys) if key_names else {}
        rows = self._run_state_query(shape, bool(key_names), keys_view, pushed)
        return DeltaResult(rows, keys if key_names else [])

    def _rescan_pushdown(self, shape: AggregateShape, keys: list[tuple]) -> dict[int, str]:
        """Views reading only the touched groups' rows of the tables the rescan joins.

        A table whose column is a group key is read with ``col = ANY(keys)``; a
        table joined to an already filtered one by an equality is read with a
        semi-join on it (``x IN (SELECT y FROM <filtered table> WHERE …)``), run
        by PostgreSQL — inner joins only, so a row outside it joins nothing that
        reaches a touched group. For INTERSECT / EXCEPT each branch is filtered
        by the row values its outputs must have. Tables used twice are read whole.
        """
        query = shape.rescan_source if shape.rescan_source is not None else shape.select
        once = Counter((t.text("db"), t.name) for t in query.find_all(exp.Table))
        if shape.rescan_source is None:
            scopes = [(shape.select, [(k.index, k.expr) for k in shape.keys])]
        else:
            scopes = [
                (
                    branch,
                    list(
                        enumerate(
                            node.this if isinstance(node, exp.Alias) else node for node in branch.expressions
                        )
                    ),
                )
                for branch in _set_branches(shape.rescan_source)
            ]
        conditions: dict[int, tuple[Source, str]] = {}
        for select, outputs in scopes:
            conditions.update(self._scope_filters(select, outputs, keys, once))
        views: dict[int, str] = {}
        for relid, (source, condition) in conditions.items():
            if not should_push_down(self._stats[relid].reltuples, len(keys)):
                continue
            df = jdbc.read_query(
                self.r.spark, self.r.target, self._select_from(source, condition), self._snap_id
            )
            name = f"{self.prefix}r_{relid}"
            self._finish_post(df, name, source)
            self.timings["key_filtered_reads"] = self.timings.get("key_filtered_reads", 0) + 1
            views[relid] = name
        return views

    def _scope_filters(
        self, select: exp.Select, outputs: list[tuple[int, exp.Expr]], keys: list[tuple], once: Counter
    ) -> dict[int, tuple[Source, str]]:
        """PostgreSQL predicates restricting the tables of one SELECT to the touched keys (by relid)."""
        try:
            items, conditions = from_items(select)
        except NotDifferentiable:
            return {}
        tables = {
            item.alias: item.node
            for item in items
            if isinstance(item.node, exp.Table) and once[(item.node.text("db"), item.node.name)] == 1
        }
        sources = {alias: self._source(t.text("db"), t.name) for alias, t in tables.items()}
        filters: dict[str, str] = {}
        for position, expr in outputs:
            column = strip_parens(expr)
            if not isinstance(column, exp.Column):
                continue
            alias = column.table or (next(iter(tables)) if len(items) == 1 and tables else "")
            if alias not in tables or alias in filters:
                continue
            col_type = dict(sources[alias].column_types).get(column.name)
            if col_type is None:
                continue
            values = sorted({k[position] for k in keys if k[position] is not None}, key=repr)
            filters[alias] = self._key_condition(
                column.name, col_type, values, any(k[position] is None for k in keys)
            )
        links = []
        for condition in conditions:
            for conjunct in conjuncts(condition):
                conjunct = strip_parens(conjunct)
                if isinstance(conjunct, exp.EQ):
                    left, right = strip_parens(conjunct.this), strip_parens(conjunct.expression)
                    if (
                        isinstance(left, exp.Column)
                        and isinstance(right, exp.Column)
                        and left.table in tables
                        and right.table in tables
                        and left.table != right.table
                    ):
                        links += [
                            (left.table, left.name, right.table, right.name),
                            (right.table, right.name, left.table, left.name),
                        ]
        grown = bool(filters)
        while grown:
            grown = False
            for have, have_col, other, other_col in links:
                if have in filters and other not in filters:
                    filters[other] = (
                        f"{quote_ident(other_col)} IN (SELECT {quote_ident(have_col)} FROM "
                        f"{sources[have].qualified} WHERE {filters[have]})"
                    )
                    grown = True
        return {sources[alias].relid: (sources[alias], condition) for alias, condition in filters.items()}

    def _run_state_query(
        self, shape: AggregateShape, restricted: bool, keys_view: str, pushed: dict[int, str]
    ) -> list[tuple] | Staged:
        """The state query over the sources' state after the window, for the touched groups only."""
        table_map: dict[tuple[str, str], str] = {("pgt_dvm", keys_view): keys_view}
        column_types: dict[tuple[str, str], dict[str, str]] = {("pgt_dvm", keys_view): {}}
        for source in self.st.sources:
            view = pushed.get(source.relid) or self._post_view(source, -1, frozenset(), {}, {})
            table_map[(source.schema, source.name)] = view
            column_types[(source.schema, source.name)] = self._column_types[("pgt_dvm", view)]
        cache = self.r.dvm_cache
        key = (
            self.st.pgt_id,
            self.st.normalized_query,
            "rescan",
            restricted,
            tuple(sorted(table_map.items())),
        )
        if key not in cache:
            query = (
                agg_rules.rescan_query(shape, f"pgt_dvm.{keys_view}")
                if restricted
                else agg_rules.state_query(shape)
            )
            cache[key] = translate_to_spark(query.sql("postgres"), table_map, column_types)
        stored = list(self.layout.columns)
        names = [f"__pgt_c{i}" for i in range(len(stored))]
        types = self.r.cached(("stored", self.st.pgt_id, self.layout.columns), self._stored_types)
        inner = f"SELECT * FROM ({cache[key]}) AS __pgt_s({', '.join(spark_name(n) for n in names)})"
        return self._collect(
            self._output(inner, names, [types.get(c, "") for c in stored], self.layout.key_positions)
        )

    # ------------------------------------------------------------- apply
    def _apply(
        self,
        result: DeltaResult,
        history_id: int,
        snapshot: str,
        lsn: str,
        request_ids: Sequence[int],
        spark_seconds: float,
    ) -> tuple[int, int]:
        st = self.st
        conn = self.conn
        target = st.qualified
        shape = self.analysis.shape
        with conn.transaction():
            commit.lock_for_apply(conn, st)
            triggers = user_triggers.begin(conn, st, "DIFFERENTIAL")
            inserted = deleted = 0
            if result.rows or result.keys:
                buffer = _own_buffer(conn, st)
                if isinstance(shape, (LinearShape, PartitionedShape, RecomputeShape)):
                    inserted, deleted = self._apply_linear(
                        result.rows, target, buffer, replaces=result.replaces
                    )
                elif isinstance(shape, AggregateShape) and shape.strategy == RESCAN:
                    inserted, deleted = self._apply_rescan(shape, result, target, buffer)
                else:
                    assert isinstance(shape, AggregateShape)
                    inserted, deleted = self._apply_algebraic(shape, result.rows, target, buffer)
            commit.complete(
                conn,
                st,
                snapshot=snapshot,
                lsn=lsn,
                history_id=history_id,
                inserted=inserted,
                deleted=deleted,
                spark_seconds=spark_seconds,
                request_ids=request_ids,
                recomputed=False,
            )
            user_triggers.finish(conn, st, triggers, inserted, deleted, history_id)
            if self.r.group is not None:
                self._drop_temps()  # the group's transaction goes on: the next member makes its own
            faults.point("refresh.before_commit")
        faults.point("refresh.after_commit")
        return inserted, deleted

    def _drop_temps(self) -> None:
        for name in (DELTA_TABLE, KEYS_TABLE, RAW_TABLE):
            kind = self.conn.execute(
                "SELECT relkind::text FROM pg_class WHERE oid = to_regclass(%s)", (name,)
            ).fetchone()
            if kind is not None:
                self.conn.execute(f"DROP {'VIEW' if kind[0] == 'v' else 'TABLE'} {name}")

    def _load(
        self,
        table: str,
        columns: Sequence[str],
        rows: Sequence[tuple] | Staged,
        like_columns: Sequence[str],
        extra: str = "",
    ) -> None:
        """Make temp ``table`` hold the delta under ``columns``.

        Collected rows are COPYed into a temp table typed like the stream
        table's ``like_columns`` (+ ``extra``); a staged delta becomes a temp
        view over its staging table.
        """
        conn = self.conn
        short = table.split(".")[-1]
        kind = conn.execute(
            "SELECT relkind::text FROM pg_class WHERE oid = to_regclass(%s)", (table,)
        ).fetchone()
        if kind is not None:
            conn.execute(f"DROP {'VIEW' if kind[0] == 'v' else 'TABLE'} {table}")
        if isinstance(rows, Staged):
            select = [
                f"{quote_ident(src)} AS {quote_ident(dst)}"
                for src, dst in zip(rows.columns, columns, strict=False)
            ]
            conn.execute(f"CREATE TEMP VIEW {short} AS SELECT {', '.join(select)} FROM {rows.table}")
            return
        select_like = ", ".join(quote_ident(c) for c in like_columns) or "1 AS __pgt_none"
        conn.execute(
            f"CREATE TEMP TABLE {short} ON COMMIT DROP AS "
            f"SELECT {select_like} FROM {self.st.qualified} WITH NO DATA"
        )
        if extra:
            conn.execute(f"ALTER TABLE {table} {extra}")
        col_list = ", ".join(quote_ident(c) for c in columns)
        with conn.cursor().copy(f"COPY {table} ({col_list}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        conn.execute(f"ANALYZE {table}")

    def _drop_staging(self, result: DeltaResult) -> None:
        for data in (result.rows, result.keys):
            if isinstance(data, Staged):
                for view in (DELTA_TABLE, RAW_TABLE):
                    kind = self.conn.execute(
                        "SELECT relkind::text FROM pg_class WHERE oid = to_regclass(%s)", (view,)
                    ).fetchone()
                    if kind is not None and kind[0] == "v":
                        self.conn.execute(f"DROP VIEW {view}")
                self.conn.execute(f"DROP TABLE IF EXISTS {data.table}")

    def _equality(self) -> dict[str, str]:
        """``OPERATOR(s.=)`` of the stored columns whose type has its ``=`` outside pg_catalog."""
        return self.r.cached(
            ("equality", self.st.pgt_id, self.st.relid), lambda: equality_operators(self.conn, self.st.relid)
        )

    def _apply_linear(
        self, rows: list[tuple] | Staged, target: str, buffer: _Buffer | None, replaces: bool = False
    ) -> tuple[int, int]:
        """Apply weighted rows; with ``replaces`` the rows are the whole new result (minus the table's rows)."""
        visible = [c.name for c in self.st.columns]
        self._load(
            RAW_TABLE, [*visible, WEIGHT, ROW_ID], rows, [*visible, ROW_ID], extra="ADD COLUMN __pgt_w bigint"
        )
        # Consolidate: rows that came and went in the window cancel; one row per distinct change.
        cols = ", ".join(quote_ident(c) for c in [*visible, ROW_ID])
        raw = RAW_TABLE
        if replaces:
            raw = (
                f"(SELECT {cols}, __pgt_w FROM {RAW_TABLE} UNION ALL "
                f"SELECT {cols}, -1 FROM {target}) AS __pgt_r"
            )
        self.conn.execute(
            f"CREATE TEMP TABLE {DELTA_TABLE.split('.')[-1]} ON COMMIT DROP AS "
            f"SELECT {cols}, sum(__pgt_w)::bigint AS __pgt_w, (row_number() OVER ())::int AS __pgt_seq"
            f" FROM {raw} GROUP BY {cols} HAVING sum(__pgt_w) <> 0"
        )
        self.conn.execute(f"ANALYZE {DELTA_TABLE}")
        stmts = linear_statements(target, visible, self._equality())
        expected = int(scalar(self.conn, stmts.expected_deletes))
        deleted = self._run_captured(stmts.delete, buffer, "D")
        if deleted != expected:
            raise FallbackToFull(f"the delta deletes {expected} rows but {deleted} matched the stream table")
        inserted = self._run_captured(stmts.insert, buffer, "I")
        return inserted, deleted

    def _run_captured(self, statement: str, buffer: _Buffer | None, action: str) -> int:
        """Run a DML ... RETURNING <visible columns>; record its rows in the own buffer; return the count."""
        if buffer is None:
            cur = self.conn.execute(f"WITH x AS ({statement}) SELECT count(*) FROM x")
            return int(one_row(cur)[0])
        prefix = "new_" if action == "I" else "old_"
        cols = [c.name for c in self.st.columns]
        targets = ", ".join(quote_ident(prefix + buffer.columns[c]) for c in cols if c in buffer.columns)
        values = ", ".join(f"x.{quote_ident(c)}" for c in cols if c in buffer.columns)
        target_list = ", " + targets if targets else ""
        cur = self.conn.execute(
            f"WITH x AS ({statement}), w AS (INSERT INTO {buffer.table} (xid, action{target_list})"
            f" SELECT pg_current_xact_id(), '{action}'{', ' + values if values else ''} FROM x RETURNING 1)"
            " SELECT count(*) FROM w"
        )
        return int(one_row(cur)[0])

    def _snapshot_groups(self, buffer: _Buffer | None, match_table: str, match: str, action: str) -> None:
        """Record the current rows of the affected groups in the own buffer (before: D, after: I)."""
        if buffer is None:
            return
        prefix = "new_" if action == "I" else "old_"
        cols = [c.name for c in self.st.columns if c.name in buffer.columns]
        targets = ", ".join(quote_ident(prefix + buffer.columns[c]) for c in cols)
        values = ", ".join(f"t.{quote_ident(c)}" for c in cols)
        self.conn.execute(
            f"INSERT INTO {buffer.table} (xid, action{', ' + targets if targets else ''})"
            f" SELECT pg_current_xact_id(), '{action}'{', ' + values if values else ''}"
            f" FROM {self.st.qualified} AS t WHERE EXISTS (SELECT 1 FROM {match_table} AS d WHERE {match})"
        )

    def _apply_algebraic(
        self, shape: AggregateShape, rows: list[tuple] | Staged, target: str, buffer: _Buffer | None
    ) -> tuple[int, int]:
        key_cols = [k.column for k in shape.keys]
        hidden_states = [c for c in shape.hidden_columns() if c not in key_cols]
        self._load(
            DELTA_TABLE, [*key_cols, *hidden_states, ROW_ID], rows, [*key_cols, *hidden_states, ROW_ID]
        )
        visible = [c.name for c in self.st.columns]
        stmts = self.r.cached(
            ("merge", self.st.pgt_id, self.st.normalized_query, target),
            lambda: agg_rules.merge_statements(shape, target, visible, self._equality()),
        )
        match = agg_rules.key_match(shape, "t", "d", self._equality()) if not shape.scalar else "true"
        self._snapshot_groups(buffer, DELTA_TABLE, match, "D")
        deleted = self.conn.execute(stmts.delete).rowcount if stmts.delete else 0
        updated = self.conn.execute(stmts.update).rowcount
        inserted = self.conn.execute(stmts.insert).rowcount if stmts.insert else 0
        groups = int(scalar(self.conn, f"SELECT count(*) FROM {DELTA_TABLE}"))
        if deleted + updated + inserted != groups:
            raise FallbackToFull(
                f"{groups} changed groups but {deleted + updated + inserted} matched the stream table"
            )
        self._snapshot_groups(buffer, DELTA_TABLE, match, "I")
        return inserted + updated, deleted + updated

    def _apply_rescan(
        self, shape: AggregateShape, result: DeltaResult, target: str, buffer: _Buffer | None
    ) -> tuple[int, int]:
        key_cols = [k.column for k in shape.keys]
        stored = self.layout.columns
        self._load(DELTA_TABLE, [*stored, ROW_ID], result.rows, [*stored, ROW_ID])
        if shape.scalar:
            match_k = "true"
            self.conn.execute(f"DROP TABLE IF EXISTS {KEYS_TABLE}")
            self.conn.execute(
                f"CREATE TEMP TABLE {KEYS_TABLE.split('.')[-1]} ON COMMIT DROP AS SELECT "
                f"NULL::bigint AS {ROW_ID}"
            )
        else:
            self._load(KEYS_TABLE, [*key_cols, ROW_ID], result.keys, [*key_cols, ROW_ID])
            match_k = agg_rules.key_match(shape, "t", "d", self._equality())
        if shape.scalar:
            self._snapshot_groups(buffer, KEYS_TABLE, "true", "D")
            deleted = self.conn.execute(f"DELETE FROM {target}").rowcount
            cols = ", ".join(quote_ident(c) for c in [*stored, ROW_ID])
            inserted = self.conn.execute(
                f"INSERT INTO {target} ({cols}) SELECT {cols} FROM {DELTA_TABLE}"
            ).rowcount
            self._snapshot_groups(buffer, KEYS_TABLE, "true", "I")
            return inserted, deleted
        stmts = agg_rules.replace_statements(shape, target, stored, self._equality())
        self._snapshot_groups(buffer, KEYS_TABLE, match_k, "D")
        deleted = self.conn.execute(stmts.delete).rowcount
        updated = self.conn.execute(stmts.update).rowcount if stmts.update else 0
        inserted = self.conn.execute(stmts.insert).rowcount
        self._snapshot_groups(buffer, KEYS_TABLE, match_k, "I")
        return inserted + updated, deleted + updated


@dataclass
class _Buffer:
    """The stream table's own change buffer, when some stream table reads it."""

    table: str
    columns: dict[str, str]


def _own_buffer(conn: psycopg.Connection, st: StreamTable) -> _Buffer | None:
    row = conn.execute(
        """
        SELECT c.buffer_name, c.columns FROM pgtrickle.pgt_change_sources c
         WHERE c.source_relid = %s
           AND EXISTS (SELECT 1 FROM pgtrickle.pgt_dependencies d WHERE d.source_relid = c.source_relid)
        """,
        (st.relid,),
    ).fetchone()
    if row is None:
        return None
    columns = {c["name"]: c["buf"] for c in (row[1] or [])}
    table = rows_table(row[0]).as_string(conn)
    # The buffer carries the columns its consumers read (a consumer created
    # before stream-table buffers had columns finds one missing and refreshes
    # in full instead).
    return _Buffer(table, columns)


def _buffer_columns(conn: psycopg.Connection, relids: list[int]) -> dict[int, dict[str, str]]:
    rows = conn.execute(
        "SELECT source_relid::bigint, columns FROM pgtrickle.pgt_change_sources WHERE source_relid = ANY(%s::oid[])",
        (relids,),
    ).fetchall()
    result = {}
    for relid, cols in rows:
        if isinstance(cols, str):
            cols = json.loads(cols)
        result[int(relid)] = {c["name"]: c["buf"] for c in cols or []}
    return result


def _weighted(x: str, w: str) -> str:
    """Decimal ``x`` times its weight ``w`` (±1 in a delta), keeping ``x``'s type.

    Spark types ``decimal(38,18) * bigint`` as ``decimal(38,6)`` and rounds
    (``spark.sql.decimalOperations.allowPrecisionLoss``): a sum over an
    unconstrained ``numeric`` would lose its 7th to 18th fraction digits.
    A decimal is negated instead (which cannot overflow); a weight other
    than ±1 fails loudly (docs/TYPES.md).
    """
    return (
        f"CASE WHEN {w} = 1 THEN {x} WHEN {w} = -1 THEN -{x} "
        f"ELSE raise_error('pgtrickle: a delta weight other than 1 or -1 on a decimal sum') END"
    )


def _decimal_columns(df) -> set[str]:
    """The names of ``df``'s decimal columns (analysis only, no Spark job)."""
    from pyspark.sql.types import DecimalType

    return {f.name for f in df.schema.fields if isinstance(f.dataType, DecimalType)}


def _for_copy(column: str, pg_type: str) -> str:
    """A Spark column rendered for COPY into a column of ``pg_type`` (instants keep their offset)."""
    if pg_type == "timestamp with time zone":
        return f"date_format({column}, 'yyyy-MM-dd HH:mm:ss.SSSSSSXXX')"
    return column


def _set_branches(node: exp.Expr) -> list[exp.Select]:
    """The SELECT branches of a chain of set operations."""
    while isinstance(node, exp.Subquery) and not node.alias:
        node = node.this
    if isinstance(node, exp.SetOperation):
        return _set_branches(node.this) + _set_branches(node.expression)
    return [node] if isinstance(node, exp.Select) else []


def spark_name(name: str) -> str:
    """A column name as a Spark column reference (backquoted)."""
    return "`" + name.replace("`", "``") + "`"


def finish_output(df, n_data: int, hash_positions: Sequence[int], dates: bool = True):
    """Name the first ``n_data`` columns c0.., keep the rest, append ``__pgt_row_id``.

    The row identity is ``xxhash64`` of the columns at ``hash_positions``
    (every visible column of a linear stream table; the group keys of an
    aggregate), computed the same way for FULL and DIFFERENTIAL refreshes.
    Timestamps are rendered with their offset for COPY.
    """
    from pyspark.sql.types import TimestampType

    # SQL expressions, not pyspark.sql.functions: the same code serves a local session and a
    # Spark Connect one, whichever kind the process's functions module was set up for.
    names = [f"c{i}" for i in range(n_data)] + list(df.columns[n_data:])
    named = df.toDF(*names)
    if hash_positions:
        row_id = f"xxhash64({', '.join(spark_name(names[i]) for i in hash_positions)})"
    else:
        row_id = "CAST(0 AS BIGINT)"
    cols = []
    for field_ in named.schema.fields:
        if dates and isinstance(field_.dataType, TimestampType):
            cols.append(
                f"date_format({spark_name(field_.name)}, 'yyyy-MM-dd HH:mm:ss.SSSSSSXXX') "
                f"AS {spark_name(field_.name)}"
            )
        else:
            cols.append(spark_name(field_.name))
    return named.selectExpr(*cols, f"{row_id} AS {ROW_ID}")
