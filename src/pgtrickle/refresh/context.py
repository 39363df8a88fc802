"""The typed interface between the parts of a refresh.

:class:`RefreshContext` is what a FULL run (``refresh/full.py``), a differential
run (``refresh/differential.py``), the mode decisions (``refresh/modes.py``), the
gates (``refresh/gating.py``) and an atomic group (``refresh/group.py``) use of the
refresher that runs them (``refresh/engine.py``); :class:`GroupContext` is what the members of an atomic
group refreshing now share. Both live here, below the engine and the group, so
neither imports the other's internals (docs/ARCHITECTURE.md, "Layers").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg
from pyspark.sql import DataFrame, SparkSession

from pgtrickle.catalog.store import Source, StreamTable
from pgtrickle.config import Settings
from pgtrickle.db.connection import JdbcTarget
from pgtrickle.refresh.group_changes import GroupChanges
from pgtrickle.spark import jdbc
from pgtrickle.spark.capabilities import capabilities
from pgtrickle.spark.numeric import ensure_functions
from pgtrickle.sql.translate import translate_to_spark

ProgressFn = Callable[[str], None]


class RefreshContext(Protocol):
    """The refresher as the parts of one refresh see it (implemented by ``engine.Refresher``)."""

    settings: Settings
    dsn: str
    target: JdbcTarget
    conn: psycopg.Connection
    """The catalog connection: history rows, the apply transaction."""
    progress: ProgressFn
    dvm_cache: dict[tuple[Any, ...], object]
    group: GroupContext | None
    """Set while an atomic group refreshes."""

    @property
    def spark(self) -> SparkSession: ...

    def cached(self, key: tuple[Any, ...], build: Callable[[], Any]) -> Any:
        """``build()``, computed once per key for the life of the refresher."""

    def carried_columns(self, source: Source) -> list[tuple[str, str]] | None:
        """(name, base type) of ``source``'s columns when one is not read as it is."""

    def source_select(self, source: Source) -> str | None:
        """The select list reading ``source`` exactly (``None``: read it as it is)."""

    def view_name(self, pgt_id: int, key: tuple[Any, ...]) -> str:
        """A stable Spark view name for a key-filtered read."""

    def staging_conn(self) -> AbstractContextManager[psycopg.Connection]:
        """Where to create a staging table Spark writes into."""

    def coordinator(
        self, sources: Sequence[Source] = ()
    ) -> tuple[AbstractContextManager[psycopg.Connection], str, str, str]:
        """The read transaction of a refresh: (connection context, exported snapshot id, snapshot, lsn)."""

    def commit_snapshot(self, snapshot: str) -> str:
        """The frontier to commit for a refresh that read at ``snapshot``."""

    def check_cancel(self) -> None:
        """Raise ``engine.Cancelled`` when the refresh was abandoned on request."""

    def demote(self, st: StreamTable, reason: str) -> None:
        """Analyse ``st``'s query as FULL-only from now on (its differential plan failed on Spark)."""


@dataclass
class GroupContext:
    """What the members of a group refreshing now share (see :attr:`RefreshContext.group`)."""

    name: str
    coord: psycopg.Connection
    snap_id: str
    snapshot: str
    lsn: str
    members: Mapping[int, StreamTable]
    by_relid: dict[int, int]
    """The members' table oids, mapped to their pgt_ids."""
    commit_snapshot: str = ""
    changes: GroupChanges | None = None
    """What the members applied so far recorded for their readers (set once the group's
    transaction has begun)."""
    _views: dict[int, DataFrame] = field(default_factory=dict)

    def reads_from_group(self, source: Source) -> bool:
        """Whether a refresh in this group takes ``source``'s change from the group's own
        transaction (``source`` is a member, whose refresh ran before)."""
        return self.changes is not None and source.relid in self.by_relid

    def view_of(self, refresher: RefreshContext, relid: int) -> DataFrame:
        """A Spark DataFrame of the new contents (visible columns) of the member whose table is ``relid``:
        its defining query over its sources at the group's snapshot (upstream members likewise)."""
        pgt_id = self.by_relid[relid]
        if pgt_id in self._views:
            return self._views[pgt_id]
        st = self.members[pgt_id]
        spark = refresher.spark
        stats = jdbc.table_stats(self.coord, [s.relid for s in st.sources if s.relid not in self.by_relid])
        table_map = {}
        for source in st.sources:
            view = f"pgt_grp_{pgt_id}_{source.relid}"
            if source.relid in self.by_relid:
                df = self.view_of(refresher, source.relid)
            else:
                parts = jdbc.partition_count(
                    stats[source.relid],
                    refresher.settings.jdbc_partition_rows,
                    capabilities(spark).parallelism,
                )
                df = jdbc.read_table(
                    spark,
                    refresher.target,
                    source.qualified,
                    self.snap_id,
                    jdbc.ctid_predicates(stats[source.relid], parts),
                    select=refresher.source_select(source),
                )
                if source.kind == "STREAM_TABLE":
                    df = df.drop(*[c for c in df.columns if c.startswith("__pgt_")])
            df.createOrReplaceTempView(view)
            table_map[(source.schema, source.name)] = view
        column_types = {(s.schema, s.name): dict(s.column_types) for s in st.sources}
        spark_sql = translate_to_spark(st.normalized_query, table_map, column_types)
        ensure_functions(spark, spark_sql)
        df = spark.sql(spark_sql)
        df = df.toDF(*[c.name for c in st.columns])
        self._views[pgt_id] = df
        return df
