"""A lone DIFFERENTIAL refresh prepares its plans with whole-stage code generation, and runs them with
compiled operators, only when they read many rows whole (refresh/spark_job.compiles), and leaves the
session's settings as they were.

The plans are the refresh's own, on real PostgreSQL and Spark; a spy on the two places a refresh
prepares a plan (spark/planning.py: ``planned`` and ``computed_once``) records the setting each
plan was prepared with. The oracle checks every refresh.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from pgtrickle.refresh import spark_job
from pgtrickle.refresh.spark_job import ROWS_READ_WHOLE, WHOLE_STAGE_CODEGEN
from pgtrickle.spark import planning
from tests.integration.helpers import assert_oracle, compilations, create_st, refresh

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def query(salt: int) -> str:
    """The stream table's query: a nested aggregate (hidden state tables: plans computed first, then
    one action) over a theta join (its unchanged side read whole: no key bounds it); ``salt`` a
    literal of its output (new to this JVM: no job before compiled code holding it)."""
    return (
        f"SELECT n, n + {salt} AS shifted, count(*) AS groups FROM (SELECT o.cust, count(*) AS n"
        " FROM orders o JOIN limits l ON o.amount > l.lim GROUP BY o.cust) x GROUP BY n"
    )


def salt() -> int:
    return random.randrange(10**6, 10**9)


@pytest.fixture
def prepared_with(db, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:  # type: ignore[no-untyped-def]
    """The stream table ``per_n`` created and populated; then the code generation setting of every
    plan prepared, in order."""
    _setup(db)
    seen: list[str] = []

    def spy(real: Any) -> Any:
        def prepare(df: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append(str(df.sparkSession.conf.get(WHOLE_STAGE_CODEGEN)))
            return real(df, *args, **kwargs)

        return prepare

    monkeypatch.setattr(planning, "planned", spy(planning.planned))
    monkeypatch.setattr(planning, "computed_once", spy(planning.computed_once))
    yield seen


def _setup(db) -> None:  # type: ignore[no-untyped-def]
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE orders (id int PRIMARY KEY, cust int NOT NULL, amount int NOT NULL)")
    db.sql("CREATE TABLE limits (lim int NOT NULL)")
    db.sql("INSERT INTO orders SELECT g, g % 40, g % 97 FROM generate_series(1, 2000) g")
    db.sql("INSERT INTO limits VALUES (10), (50), (90)")
    db.sql("ANALYZE orders, limits")
    create_st(db, "per_n", query(salt()), refresh_mode="DIFFERENTIAL")
    refresh(db)


def _refresh_after_changes(db, base: int) -> Any:  # type: ignore[no-untyped-def]
    """Change ``orders`` (new ids from ``base``), refresh ``per_n`` alone: its outcome, DIFFERENTIAL."""
    _change(db, base)
    [outcome] = refresh(db, "per_n")
    assert outcome.action.value == "DIFFERENTIAL", outcome.reason
    return outcome


def _change(db, base: int) -> None:  # type: ignore[no-untyped-def]
    db.sql(
        "INSERT INTO orders SELECT g, g %% 41, g %% 89 FROM generate_series(%s::int, %s::int) g",
        (base, base + 30),
    )
    db.sql("DELETE FROM orders WHERE id %% 17 = 0 AND id < %s", (base,))
    db.sql("UPDATE orders SET amount = amount + 7 WHERE id %% 23 = 0 AND id < %s", (base,))


def test_a_small_refresh_prepares_its_plans_without_code_generation(db, spark, prepared_with) -> None:  # type: ignore[no-untyped-def]
    before = spark.conf.get(WHOLE_STAGE_CODEGEN)
    outcome = _refresh_after_changes(db, 10_000)
    assert 0 < outcome.timings.get(ROWS_READ_WHOLE, 0) < spark_job.COMPILED_MIN_ROWS_READ, outcome.timings
    assert len(prepared_with) >= 2, "a kept plan prepares its parts and then its action"
    assert set(prepared_with) == {"false"}, prepared_with
    assert spark.conf.get(WHOLE_STAGE_CODEGEN) == before, "the session's setting comes back"
    assert_oracle(db, "per_n")


def test_a_small_refresh_runs_its_operators_interpreted(db, spark, prepared_with) -> None:  # type: ignore[no-untyped-def]
    """Its operators (projections, predicates, aggregation buffers) are not compiled: a second stream
    table of the same shape, its literal new to this JVM, refreshes compiling nothing. (Spark
    compiles what it has no interpreted form of - a cached read's column accessors, row joiners -
    once per column types: the first stream table's refresh compiles those.)"""
    before = spark.conf.get(spark_job.CODEGEN_FACTORY_MODE)
    create_st(db, "per_n_again", query(salt()), refresh_mode="DIFFERENTIAL")
    refresh(db)
    _change(db, 40_000)
    [warm] = refresh(db, "per_n")
    compiled = compilations(spark)
    [outcome] = refresh(db, "per_n_again")
    assert warm.action.value == outcome.action.value == "DIFFERENTIAL", outcome.reason
    assert compilations(spark) == compiled, "the operators of a small refresh were compiled"
    assert spark.conf.get(spark_job.CODEGEN_FACTORY_MODE) == before, "the session's setting comes back"
    assert_oracle(db, "per_n", "per_n_again")


def test_plans_after_many_rows_read_whole_keep_code_generation(  # type: ignore[no-untyped-def]
    db, spark, prepared_with, monkeypatch
) -> None:
    # As if the tables read whole were large: their few rows count as "many".
    monkeypatch.setattr(spark_job, "COMPILED_MIN_ROWS_READ", 1)
    outcome = _refresh_after_changes(db, 20_000)
    assert outcome.timings.get(ROWS_READ_WHOLE, 0) >= 1, outcome.timings
    assert prepared_with and prepared_with[-1] == "true", prepared_with
    assert_oracle(db, "per_n")


def test_a_session_configured_without_code_generation_stays_without(  # type: ignore[no-untyped-def]
    db, spark, prepared_with, monkeypatch
) -> None:
    monkeypatch.setattr(spark_job, "COMPILED_MIN_ROWS_READ", 1)
    before = spark.conf.get(WHOLE_STAGE_CODEGEN)
    spark.conf.set(WHOLE_STAGE_CODEGEN, "false")
    try:
        _refresh_after_changes(db, 30_000)
        assert set(prepared_with) == {"false"}, prepared_with
        assert spark.conf.get(WHOLE_STAGE_CODEGEN) == "false"
    finally:
        spark.conf.set(WHOLE_STAGE_CODEGEN, before)
    assert_oracle(db, "per_n")
