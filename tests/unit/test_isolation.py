"""The unit-test guard (tests/unit/isolation.py) refuses every way to a JVM or a database."""

from __future__ import annotations

import psycopg
import psycopg2
import pytest

from tests.unit.isolation import UnitIsolationError, forbidden_resources


def _attempts() -> dict[str, object]:
    from pathlib import Path

    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from pgtrickle.config import Settings
    from pgtrickle.db.embedded import EmbeddedPostgres
    from pgtrickle.spark import session

    return {
        "spark session": lambda: SparkSession.builder.master("local[1]").getOrCreate(),
        "spark context": lambda: SparkContext("local[1]", "unit"),
        "pgtrickle get_spark": lambda: session.get_spark(Settings()),
        "psycopg.connect": lambda: psycopg.connect("postgresql://u@127.0.0.1:1/x"),
        "psycopg Connection.connect": lambda: psycopg.Connection.connect("postgresql://u@127.0.0.1:1/x"),
        "psycopg2.connect": lambda: psycopg2.connect("postgresql://u@127.0.0.1:1/x"),
        "embedded server": lambda: EmbeddedPostgres(Path("/nonexistent"), 1).start(),
    }


@pytest.mark.parametrize("name", list(_attempts()))
def test_each_door_is_refused_and_recorded(name: str) -> None:
    with forbidden_resources() as seen:
        with pytest.raises(UnitIsolationError, match=r"move this test .* to tests/integration"):
            _attempts()[name]()
        assert len(seen) == 1
