"""FULL refresh: the defining query recomputed on Spark, the stream table's contents replaced.

1. A coordinator transaction exports snapshot S2 (an atomic group shares its own); Spark reads
   every source at it over JDBC (an upstream member of a group: its new contents, computed in the
   same job; a ``hold_back`` source: as it was at its watermark's snapshot), and runs the defining
   query translated to Spark SQL (a stream table keeping its root aggregate's state: that state,
   by the delta engine's compiler over the same source views).
2. The result is moved into PostgreSQL: by COPY when small, by partitioned JDBC writes into an
   unlogged staging table ``pgtrickle_changes.stage_<id>`` when large.
3. One PostgreSQL transaction truncates the stream table and inserts the result, fills the
   hidden state tables of the nodes its delta plan keeps (computed over the same views), records the
   refresh in its own change buffer (for downstream stream tables), advances the frontier and
   completes the history row (:mod:`pgtrickle.refresh.commit`).

The engine (``refresh/engine.py``) runs it, also as the fallback of a differential run; it uses
the refresher only through :class:`~pgtrickle.refresh.context.RefreshContext`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from datetime import datetime

import psycopg
from psycopg import sql

from pgtrickle import faults
from pgtrickle.catalog import identity
from pgtrickle.catalog.store import StreamTable
from pgtrickle.cdc.buffers import rows_table
from pgtrickle.db.columns import column_types
from pgtrickle.db.query import scalar
from pgtrickle.dvm.kept import StateTable
from pgtrickle.dvm.layout import Layout
from pgtrickle.errors import RefreshError
from pgtrickle.refresh import as_of, commit, user_triggers
from pgtrickle.refresh.clock_read import clock_values
from pgtrickle.refresh.context import RefreshContext
from pgtrickle.refresh.differential import spark_name
from pgtrickle.refresh.layout_ddl import kept_state_sql, row_index_name, stored_state_sql
from pgtrickle.refresh.output import finish_output
from pgtrickle.refresh.plan import RefreshPlan
from pgtrickle.refresh.state_tables import fill_state_table
from pgtrickle.spark import carry, jdbc, planning
from pgtrickle.spark.capabilities import capabilities, tag_jobs
from pgtrickle.sql.clock import pin_clock
from pgtrickle.sql.translate import translate_to_spark

log = logging.getLogger(__name__)

COPY_THRESHOLD_ROWS = 200_000
"""Results estimated at or below this many rows travel by COPY, larger ones by JDBC."""

KeptRows = tuple[StateTable, list[tuple], dict[str, tuple[int, int]]]
"""A hidden state table, its new rows, and the Spark (precision, scale) of its decimal columns."""


class FullRun:
    """One FULL refresh of one stream table (used by the engine)."""

    def __init__(self, refresher: RefreshContext, st: StreamTable, layout: Layout) -> None:
        self.r = refresher
        self.st = st
        self.layout = layout
        self.conn: psycopg.Connection = refresher.conn
        self.timings: dict[str, float] = {}
        """Seconds per phase: ``spark_session``, ``spark_job``, ``apply``."""

    def run(self, plan: RefreshPlan, history_id: int, request_ids: Sequence[int]) -> tuple[int, int, float]:
        """Returns (inserted, deleted, spark seconds)."""
        st, layout = self.st, self.layout
        timings = self.timings
        t0 = time.monotonic()
        spark = self.r.spark
        timings["spark_session"] = time.monotonic() - t0
        self.r.check_cancel()
        staging = f"stage_{st.pgt_id}"
        coordinator, snap_id, snapshot, lsn = self.r.coordinator(st.sources)
        with coordinator as coord, carry.refusals_checked(lambda: spark, coord):
            stats = jdbc.table_stats(coord, [s.relid for s in st.sources])
            self.r.progress(f"{st.display}: reading {len(st.sources)} source(s) at snapshot {snapshot}")
            table_map = {}
            for source in st.sources:
                view = f"pgt_src_{source.relid}"
                if self.r.group is not None and source.relid in self.r.group.by_relid:
                    # An upstream member of an atomic group: its new contents, computed in this job.
                    self.r.group.view_of(self.r, source.relid).createOrReplaceTempView(view)
                    table_map[(source.schema, source.name)] = view
                    continue
                parts = jdbc.partition_count(
                    stats[source.relid], self.r.settings.jdbc_partition_rows, capabilities(spark).parallelism
                )
                df = jdbc.read_table(
                    spark,
                    self.r.target,
                    source.qualified,
                    snap_id,
                    jdbc.ctid_predicates(stats[source.relid], parts),
                    select=self.r.source_select(source),
                )
                if source.kind == "STREAM_TABLE":
                    df = df.drop(*[c for c in df.columns if c.startswith("__pgt_")])
                cap = st.watermark_mark.caps.get(source.relid) if st.watermark_mark else None
                if cap is not None:  # hold_back: the source as it was at its watermark's snapshot
                    df = as_of.read_as_of(
                        spark, self.conn, self.r.target, self.r.dsn, source, df, cap, snapshot
                    )
                df.createOrReplaceTempView(view)
                table_map[(source.schema, source.name)] = view
            column_types = {(s.schema, s.name): dict(s.column_types) for s in st.sources}
            query_sql, data_timestamp = st.normalized_query, None
            if st.reads_clock:
                # now() & co mean the snapshot's time, in every partition (pgtrickle.sql.clock).
                values = clock_values(coord)
                query_sql, data_timestamp = pin_clock(query_sql, values), values.timestamptz
            if layout.stored is not None:
                # The stored aggregate's state (visible and hidden columns), by the delta engine's
                # compiler over the same source views.
                text = stored_state_sql(st, layout.stored, table_map)
                result = planning.sql(spark, text, timings, "full").drop("__pgt_w")
            else:
                text = translate_to_spark(query_sql, table_map, column_types)
                result = planning.sql(spark, text, timings, "full")
            if len(result.columns) != len(layout.columns):
                raise RefreshError(
                    f"the query of {st.display} returns {len(result.columns)} columns on Spark but the "
                    f"stream table has {len(layout.columns)}"
                )
            result = finish_output(result, len(layout.columns), layout.key_positions)
            state_rows = self._kept_rows(table_map)
            estimate = sum(stats[s.relid].reltuples for s in st.sources)
            tag_jobs(spark, f"pgtrickle-{st.pgt_id}", f"refresh {st.display}")
            faults.point("refresh.spark_job")
            t1 = time.monotonic()
            rows: list[tuple] | None = None
            if estimate <= COPY_THRESHOLD_ROWS:
                self.r.progress(f"{st.display}: computing on Spark (result by COPY)")
                rows = [tuple(r) for r in planning.planned(result, timings, "full").collect()]
            else:
                # Large sources often give a small result (an aggregate): try to take it whole,
                # capped; only a result over the cap is written by JDBC (computed again).
                self.r.progress(f"{st.display}: computing on Spark (~{int(estimate):,} source rows)")
                head = planning.planned(result.limit(COPY_THRESHOLD_ROWS + 1), timings, "full").collect()
                if len(head) <= COPY_THRESHOLD_ROWS:
                    rows = [tuple(r) for r in head]
                else:
                    del head
                    self.r.progress(f"{st.display}: large result: writing it by JDBC into a staging table")
                    self._create_staging(st, staging, layout)
                    jdbc.write_append(result, self.r.target, f'pgtrickle_changes."{staging}"')
            timings["spark_job"] = time.monotonic() - t1
            if self.r.group is None:
                coord.rollback()
        self.r.check_cancel()
        t2 = time.monotonic()
        inserted, deleted = self._apply_full(
            st,
            plan,
            history_id,
            self.r.commit_snapshot(snapshot),
            lsn,
            rows,
            staging,
            request_ids,
            timings["spark_job"],
            layout,
            data_timestamp,
            state_rows,
        )
        timings["apply"] = time.monotonic() - t2
        if rows is None:
            self.conn.execute(
                sql.SQL("DROP TABLE IF EXISTS pgtrickle_changes.{}").format(sql.Identifier(staging))
            )
        return inserted, deleted, timings["spark_job"]

    def _kept_rows(self, views: Mapping[tuple[str, str], str]) -> list[KeptRows]:
        """Each hidden state table's new contents (its rows, each with its row identity) over the
        sources' views of this FULL refresh: the same snapshot as the stream table's; and the
        Spark decimal type (precision, scale) of each decimal column, which the table's column
        takes so that reading it back gives the values the type they are computed with."""
        from pyspark.sql.types import DecimalType

        st = self.st
        out = []
        for table in self.layout.state_tables:
            value = planning.sql(self.r.spark, kept_state_sql(st, table.node, views), self.timings, "kept")
            decimals = {
                column: (f.dataType.precision, f.dataType.scale)
                for column, f in zip(table.columns, value.schema.fields, strict=False)
                if isinstance(f.dataType, DecimalType)
            }
            expanded = value.selectExpr(
                *(spark_name(c) for c in table.columns),
                f"explode(sequence(CAST(1 AS BIGINT), {spark_name('__pgt_w')})) AS __pgt_i",
            ).drop("__pgt_i")
            n = len(table.columns)
            rows = finish_output(expanded, n, table.hash_positions).limit(COPY_THRESHOLD_ROWS + 1).collect()
            if len(rows) > COPY_THRESHOLD_ROWS:
                raise RefreshError(
                    f"the hidden state table {table.name} of {st.display} would hold more than "
                    f"{COPY_THRESHOLD_ROWS:,} rows; refresh this stream table with refresh_mode => 'FULL'"
                )
            out.append((table, [tuple(r) for r in rows], decimals))
        return out

    def _create_staging(self, st: StreamTable, staging: str, layout: Layout) -> None:
        types = column_types(self.conn, st.relid)
        cols: list[sql.Composable] = [
            sql.SQL("{} {}").format(sql.Identifier(f"c{i}"), sql.SQL(types[c]))
            for i, c in enumerate(layout.columns)
        ]
        cols.append(sql.SQL("__pgt_row_id bigint"))
        with self.r.staging_conn() as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS pgtrickle_changes.{}").format(sql.Identifier(staging)))
            conn.execute(
                sql.SQL("CREATE UNLOGGED TABLE pgtrickle_changes.{} ({})").format(
                    sql.Identifier(staging), sql.SQL(", ").join(cols)
                )
            )

    def _apply_full(
        self,
        st: StreamTable,
        plan: RefreshPlan,
        history_id: int,
        snapshot: str,
        lsn: str,
        rows: list[tuple] | None,
        staging: str,
        request_ids: Sequence[int],
        spark_seconds: float,
        layout: Layout,
        data_timestamp: datetime | None = None,
        state_rows: Sequence[KeptRows] = (),
    ) -> tuple[int, int]:
        target = sql.SQL("{}.{}").format(sql.Identifier(st.schema), sql.Identifier(st.name))
        col_list = sql.SQL(", ").join(
            [sql.Identifier(c) for c in layout.columns] + [sql.Identifier("__pgt_row_id")]
        )
        with self.conn.transaction():
            commit.lock_for_apply(self.conn, st)
            triggers = user_triggers.begin(self.conn, st, "FULL")
            deleted = scalar(self.conn, sql.SQL("SELECT count(*) FROM {}").format(target))
            self.conn.execute(sql.SQL("TRUNCATE {}").format(target))
            if rows is not None:
                with self.conn.cursor().copy(
                    sql.SQL("COPY {} ({}) FROM STDIN").format(target, col_list)
                ) as copy:
                    for row in rows:
                        copy.write_row(row)
                inserted = len(rows)
            else:
                source_cols = sql.SQL(", ").join(
                    [sql.Identifier(f"c{i}") for i in range(len(layout.columns))]
                    + [sql.Identifier("__pgt_row_id")]
                )
                # A large result: building the row-identity index once afterwards is much
                # cheaper than maintaining it row by row (measured 88 s vs 39 s for 10M rows).
                index = row_index_name(st)
                self.conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(st.schema, index)))
                cur = self.conn.execute(
                    sql.SQL("INSERT INTO {} ({}) SELECT {} FROM pgtrickle_changes.{}").format(
                        target, col_list, source_cols, sql.Identifier(staging)
                    )
                )
                inserted = cur.rowcount
                if layout.differential:
                    self.conn.execute(
                        sql.SQL("CREATE INDEX {} ON {} (__pgt_row_id)").format(sql.Identifier(index), target)
                    )
            # Downstream stream tables learn of this refresh through our own buffer.
            self.conn.execute(
                sql.SQL("INSERT INTO {} (xid, action) VALUES (pg_current_xact_id(), 'T')").format(
                    rows_table(f"changes_{st.relid}")
                )
            )
            if layout.finalize:
                self.conn.execute(layout.finalize)
            for table, kept_rows, decimals in state_rows:
                fill_state_table(self.conn, table, kept_rows, decimals)
            if layout.differential and layout.unique_keys:
                self._guard_keys(st, layout)
            commit.complete(
                self.conn,
                st,
                snapshot=snapshot,
                lsn=lsn,
                history_id=history_id,
                inserted=int(inserted),
                deleted=int(deleted),
                spark_seconds=spark_seconds,
                request_ids=request_ids,
                data_timestamp=data_timestamp,
                recomputed=True,
            )
            user_triggers.finish(self.conn, st, triggers, int(inserted), int(deleted), history_id)
            faults.point("refresh.before_commit")
        faults.point("refresh.after_commit")
        return int(inserted), int(deleted)

    def _guard_keys(self, st: StreamTable, layout: Layout) -> None:
        """A unique index on the group key: a delta that missed its group fails instead of duplicating it."""
        keys = [layout.columns[i] for i in layout.key_positions]
        if not keys:
            return
        name = f"pgt_keys_{st.relid}"
        try:
            with self.conn.transaction():
                identity.pin(self.conn, [identity.stream_table_pin(st)], identity.WRITE)
                self.conn.execute(
                    sql.SQL("CREATE UNIQUE INDEX IF NOT EXISTS {} ON {}.{} ({}) NULLS NOT DISTINCT").format(
                        sql.Identifier(name),
                        sql.Identifier(st.schema),
                        sql.Identifier(st.name),
                        sql.SQL(", ").join(sql.Identifier(k) for k in keys),
                    )
                )
        except psycopg.Error as err:
            log.info("%s: no unique index on the group key (%s)", st.display, err)
