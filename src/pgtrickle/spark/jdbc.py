"""Spark JDBC reads at one exported snapshot, and JDBC writes.

Every partition of every read of one refresh starts its session with
``BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT
'<id>'`` so all of them see exactly the snapshot the coordinator exported
(docs/ARCHITECTURE.md, invariant 4). Large tables are split into block ranges by
``ctid`` (PostgreSQL's TID range scans make each range cheap to read), which
works for any heap table, with or without a numeric key.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from pgtrickle.db.connection import JdbcTarget


@dataclass(frozen=True)
class TableStats:
    """Planner statistics used to size a partitioned read."""

    reltuples: float
    relpages: int
    bytes: int | None = None
    """The size of the relation's data as of its last VACUUM or ANALYZE, read without a lock:
    :data:`RELATION_BYTES` (``None``: not known - a partitioned or foreign table)."""


ROW_ESTIMATE = "greatest(reltuples::float8, pg_stat_get_live_tuples(oid)::float8, 0)"
"""SQL over ``pg_class``: a relation's row count as the refresh sizes it. ``reltuples`` is -1 until
the table is first analysed (right after a bulk load, or a hidden state table's first population),
which read as 0 took a 150,000-row table for an empty one: read whole, never by key; the live rows
the statistics system counts since are taken then (and when they are more)."""


RELATION_BYTES = "CASE WHEN relkind IN ('r', 'm') THEN relpages::bigint * 8192 END"
"""SQL over ``pg_class``: a relation's data files as of its last VACUUM or ANALYZE, read without a
lock (``pg_relation_size`` takes one, and waits behind an atomic group's transaction that
truncated the table); NULL for a partitioned table (its rows are in its partitions) or a foreign
one. ``relpages`` lags a bulk load (0 until the first ANALYZE): a broadcast also needs the row
count the statistics system keeps (:data:`ROW_ESTIMATE`) small."""


def table_stats(conn, relids: list[int]) -> dict[int, TableStats]:
    """Planner statistics of the given relations (psycopg connection); rows: :data:`ROW_ESTIMATE`,
    bytes: :data:`RELATION_BYTES`."""
    rows = conn.execute(
        f"SELECT oid::bigint, {ROW_ESTIMATE}, relpages, {RELATION_BYTES} FROM pg_class WHERE oid = ANY(%s::oid[])",
        (relids,),
    ).fetchall()
    return {int(r[0]): TableStats(float(r[1]), int(r[2]), None if r[3] is None else int(r[3])) for r in rows}


_session_guards: OrderedDict[str, str] = OrderedDict()
"""Per exported snapshot: SQL each Spark session runs after joining it (see :func:`guard_snapshot`).
Only the latest few are kept: an exported snapshot lives only as long as its refresh's read."""
_GUARDS_KEPT = 256
_guards_lock = threading.Lock()


def guard_snapshot(snapshot_id: str, guard_sql: str | None) -> None:
    """Have every Spark session that joins ``snapshot_id`` run ``guard_sql`` first (None: forget it).

    The refresh pins its sources this way (pgtrickle.catalog.identity.session_guard): each
    session locks the tables it may read and checks their names still lead to the tracked OIDs.
    """
    with _guards_lock:  # parallel refreshes (daemon/workers.py) guard their snapshots from several threads
        if guard_sql is None:
            _session_guards.pop(snapshot_id, None)
        else:
            _session_guards[snapshot_id] = guard_sql
            while len(_session_guards) > _GUARDS_KEPT:
                _session_guards.popitem(last=False)


def snapshot_init_statement(snapshot_id: str) -> str:
    if not snapshot_id.replace("-", "").isalnum():
        raise ValueError(f"not a snapshot id: {snapshot_id!r}")
    with _guards_lock:
        guard = _session_guards.get(snapshot_id)
    if guard:
        return (
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; "
            f"SET TRANSACTION SNAPSHOT '{snapshot_id}'; "
            "SET LOCAL search_path = pg_catalog, pg_temp; " + guard
        )
    # A fixed search_path: nothing Spark's queries name can resolve to another role's object.
    return (
        "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; "
        f"SET TRANSACTION SNAPSHOT '{snapshot_id}'; "
        "SET LOCAL search_path = pg_catalog, pg_temp"
    )


def ctid_predicates(stats: TableStats, partitions: int) -> list[str]:
    """Block-range predicates covering the whole table, the last one open-ended.

    Pure: the ranges split ``relpages`` evenly; rows in pages added since the
    statistics were taken fall into the last, open-ended range.
    """
    if partitions <= 1 or stats.relpages <= 1:
        return ["true"]
    partitions = min(partitions, stats.relpages)
    step = math.ceil(stats.relpages / partitions)
    bounds = list(range(0, stats.relpages, step))
    preds = []
    for i, lo in enumerate(bounds):
        if i == len(bounds) - 1:
            preds.append(f"ctid >= '({lo},0)'::tid")
        else:
            hi = bounds[i + 1]
            preds.append(f"ctid >= '({lo},0)'::tid AND ctid < '({hi},0)'::tid")
    return preds


def partition_count(stats: TableStats, rows_per_partition: int, parallelism: int) -> int:
    """How many parallel reads a table deserves (pure)."""
    if stats.reltuples <= rows_per_partition:
        return 1
    wanted = math.ceil(stats.reltuples / rows_per_partition)
    return max(1, min(wanted, max(2, parallelism * 2)))


def read_table(
    spark,
    target: JdbcTarget,
    qualified_name: str,
    snapshot_id: str,
    predicates: list[str],
    fetch_size: int = 10_000,
    select: str | None = None,
):
    """A DataFrame over one PostgreSQL relation, read at ``snapshot_id``.

    ``select`` is the select list to read (see :mod:`pgtrickle.spark.carry`);
    by default every column as it is. With a select list each block range is
    read as a query of its own and the parts are unioned.
    """
    if select is not None:
        from functools import reduce

        parts = [
            read_query(
                spark, target, f"SELECT {select} FROM {qualified_name} WHERE {pred}", snapshot_id, fetch_size
            )
            for pred in predicates
        ]
        return reduce(lambda a, b: a.unionAll(b), parts)
    props = dict(target.properties)
    props.update(
        {
            "driver": "org.postgresql.Driver",
            "sessionInitStatement": snapshot_init_statement(snapshot_id),
            "fetchsize": str(fetch_size),
            # timestamp (without time zone) stays zone-less; timestamptz is an instant.
            "preferTimestampNTZ": "true",
        }
    )
    if predicates == ["true"]:
        return (
            spark.read.format("jdbc")
            .option("url", target.url)
            .option("dbtable", qualified_name)
            .options(**props)
            .load()
        )
    return spark.read.jdbc(target.url, qualified_name, predicates=predicates, properties=props)


def write_append(df, target: JdbcTarget, qualified_name: str, batch_size: int = 10_000) -> None:
    """Append a DataFrame to an existing table over JDBC (batched inserts)."""
    (
        df.write.format("jdbc")
        .option("url", target.url)
        .option("dbtable", qualified_name)
        .option("batchsize", str(batch_size))
        .options(**target.properties)
        .option("driver", "org.postgresql.Driver")
        .mode("append")
        .save()
    )


_recording: ContextVar[list[str] | None] = ContextVar("pgtrickle_checked_reads", default=None)
"""Per context (a thread, and the reads it runs in other threads: spark/overlap.py)."""


@contextmanager
def checked_reads() -> Iterator[list[str]]:
    """The queries of the reads this context starts within the block whose values are checked
    (:mod:`pgtrickle.spark.carry`): where a failed job's refusal is looked for."""
    reads: list[str] = []
    token = _recording.set(reads)
    try:
        yield reads
    finally:
        _recording.reset(token)


def read_query(
    spark,
    target: JdbcTarget,
    query: str,
    snapshot_id: str | None,
    fetch_size: int = 10_000,
):
    """A DataFrame over the rows of a PostgreSQL query (one partition).

    With ``snapshot_id`` the query runs at that exported snapshot; without,
    at a fresh snapshot of its own (change-buffer reads filter their window
    explicitly, so they need none).
    """
    reads = _recording.get()
    if reads is not None and "pgtrickle._value_not_carried(" in query:
        reads.append(query)
    props = dict(target.properties)
    props.update(
        {"driver": "org.postgresql.Driver", "fetchsize": str(fetch_size), "preferTimestampNTZ": "true"}
    )
    if snapshot_id is not None:
        props["sessionInitStatement"] = snapshot_init_statement(snapshot_id)
    return (
        spark.read.format("jdbc")
        .option("url", target.url)
        .option("dbtable", f"({query}) AS pgt_q")
        .options(**props)
        .load()
    )
