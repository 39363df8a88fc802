"""Helpers for integration tests: refresh synchronously, and the oracle."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from hypothesis import strategies as st

from pgtrickle.refresh.verify import verify
from tests.conftest import Database

if TYPE_CHECKING:
    from pgtrickle.refresh.engine import RefreshOutcome


DML_ROUNDS = st.lists(
    st.tuples(st.sampled_from(["insert", "update", "delete"]), st.integers(1, 400), st.integers(-50, 50)),
    min_size=1,
    max_size=8,
)
"""A round of random DML on a source: (kind, key, value) statements, for a test to apply its way."""


def create_st(db: Database, name: str, query: str, **kw: object) -> None:
    """pgtrickle.create_stream_table with named arguments."""
    args = "".join(f", {k} => %({k})s" for k in kw)
    db.sql(
        f"SELECT pgtrickle.create_stream_table(%(name)s, %(query)s{args})",
        {"name": name, "query": query, **kw},
    )


def refresh(db: Database, *names: str) -> list[RefreshOutcome]:
    from pgtrickle.daemon.manual import refresh_sync

    return refresh_sync(db.settings, db.dsn, list(names) if names else None)


def assert_oracle(db: Database, *names: str) -> None:
    """Every named stream table equals its defining query (two-way EXCEPT ALL)."""
    if not names:
        names = tuple(r[0] for r in db.sql("SELECT name FROM pgtrickle.stream_tables_info ORDER BY pgt_id"))
    for name in names:
        result = verify(db.conn, name)
        assert result.ok, f"{name}: {result.missing} rows missing, {result.extra} rows extra"


def refresh_and_check(db: Database, *names: str) -> list[RefreshOutcome]:
    outcomes = refresh(db, *names)
    assert_oracle(db, *names)
    return outcomes


def catalog_fingerprint(db: Database) -> tuple:
    """Everything a failed API call must leave unchanged."""
    tables = [
        "pgt_stream_tables",
        "pgt_dependencies",
        "pgt_change_sources",
        "pgt_refresh_requests",
        "pgt_refresh_history",
    ]
    content = tuple(tuple(map(str, db.sql(f"SELECT * FROM pgtrickle.{t} ORDER BY 1"))) for t in tables)
    relations = tuple(
        db.sql(
            "SELECT n.nspname, c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') ORDER BY 1, 2"
        )
    )
    triggers = tuple(
        db.sql("SELECT tgrelid::regclass::text, tgname FROM pg_trigger WHERE NOT tgisinternal ORDER BY 1, 2")
    )
    functions = tuple(
        db.sql(
            "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n"
            " ON n.oid = p.pronamespace WHERE n.nspname = 'pgtrickle_changes' ORDER BY 1"
        )
    )
    return content, relations, triggers, functions


def store_unparsed_schedule(db: Database, text: str, name: str | None = None) -> None:
    """Store ``text`` as the schedule of stream table ``name`` (every one when None) without its
    parsed form, as an older version or a hand edit with the catalog's trigger disabled could
    leave it: the catalog's trigger refuses such a write otherwise (docs/SQL_API.md)."""
    with db.conn.transaction():
        db.sql("ALTER TABLE pgtrickle.pgt_stream_tables DISABLE TRIGGER parse_schedule")
        db.sql(
            "UPDATE pgtrickle.pgt_stream_tables SET schedule = %s, schedule_parsed = NULL"
            " WHERE %s::text IS NULL OR pgt_name = %s",
            (text, name, name),
        )
        db.sql("ALTER TABLE pgtrickle.pgt_stream_tables ENABLE TRIGGER parse_schedule")


def without_broadcasts(jobs: int | None, why: str | None) -> int | None:
    """A refresh's Spark jobs (``spark_jobs``) other than the broadcasts of small tables its
    ``spark_jobs_why`` counts (Spark runs each as a job of its own before the plan's:
    :data:`pgtrickle.spark.jobs.BROADCAST_SITE`)."""
    from pgtrickle.spark.jobs import BROADCAST_SITE

    if jobs is None or why is None:
        return jobs
    return jobs - sum(int(n) for n in re.findall(rf"(\d+)x {re.escape(BROADCAST_SITE)}", why))


def action_jobs(db: Database, name: str) -> int | None:
    """The Spark jobs of ``name``'s last refresh other than broadcasts (:func:`without_broadcasts`)."""
    [(jobs, why)] = db.sql(
        "SELECT spark_jobs, spark_jobs_why FROM pgtrickle.get_refresh_history(%s, 1)", (name,)
    )
    return without_broadcasts(jobs, why)


def compilations(spark: object) -> int:
    """How many times this JVM's Spark compiled generated code so far (its codegen metrics): with
    a local master, every compilation of every job of the session counts."""
    metrics = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics  # type: ignore[attr-defined]  # py4j
    return int(metrics.METRIC_COMPILATION_TIME().getCount())
