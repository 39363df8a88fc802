"""Unit tests start no JVM and open no database: the guard that keeps that true.

``forbidden_resources()`` replaces, for the duration of a ``with`` block, every door through
which a test could reach Spark or PostgreSQL: starting a SparkSession or a SparkContext (and
pgtrickle's ``get_spark``, which may hand out a session an earlier integration test started in
the same process), launching the Py4J gateway (the JVM), connecting with psycopg 3 or psycopg2,
and starting the embedded PostgreSQL server.  Each attempt raises :class:`UnitIsolationError`
and is recorded, so a test that swallows the exception is still caught: tests/unit/conftest.py
fails it after the phase (setup, call, teardown) in which the attempt happened.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest


class UnitIsolationError(AssertionError):
    """A unit test tried to start a JVM or to open a database connection."""


#: (module, attribute path, what it does) for every door the guard closes.
DOORS: tuple[tuple[str, str, str], ...] = (
    ("pyspark.sql.session", "SparkSession.Builder.getOrCreate", "start a SparkSession"),
    ("pyspark.core.context", "SparkContext.__init__", "start a SparkContext"),
    ("pyspark.core.context", "launch_gateway", "launch the Spark JVM"),
    ("pyspark.java_gateway", "launch_gateway", "launch the Spark JVM"),
    ("pgtrickle.spark.session", "get_spark", "use a SparkSession"),
    ("psycopg", "connect", "open a PostgreSQL connection"),
    ("psycopg", "Connection.connect", "open a PostgreSQL connection"),
    ("psycopg", "AsyncConnection.connect", "open a PostgreSQL connection"),
    ("psycopg2", "connect", "open a PostgreSQL connection"),
    ("pgtrickle.db.embedded", "EmbeddedPostgres.start", "start a PostgreSQL server"),
)

MOVE_HINT = (
    "unit tests start no JVM and open no database; move this test (or its Spark/PostgreSQL part) "
    "to tests/integration"
)


def _refusal(what: str, door: str, seen: list[str]) -> Callable[..., object]:
    def refuse(*_args: object, **_kwargs: object) -> object:
        seen.append(f"{door}: tried to {what}")
        raise UnitIsolationError(f"{door}: a unit test tried to {what}; {MOVE_HINT}")

    return refuse


@contextmanager
def forbidden_resources() -> Iterator[list[str]]:
    """Close every door in DOORS; yield the list the attempts are recorded in."""
    import importlib

    seen: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        for module_name, path, what in DOORS:
            target: object = importlib.import_module(module_name)
            *owners, attribute = path.split(".")
            for owner in owners:
                target = getattr(target, owner)
            patch.setattr(target, attribute, _refusal(what, f"{module_name}.{path}", seen))
        yield seen
