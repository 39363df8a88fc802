"""Queries that read the clock: ``now()`` and friends, pinned to the refresh snapshot's time.

A defining query such as ``... WHERE ts > now() - interval '20 seconds'``
changes its result as time passes, with no change to its sources. Such a
stream table (``reads_clock`` in the catalog, detected at creation from
PostgreSQL's parse tree by ``pgtrickle._reads_clock``) is recomputed in full
at every scheduled refresh.

The clock must mean one instant per refresh: the time of the refresh's
snapshot, the same in every Spark partition, and one the test oracle (and
``pgtrickle verify``) can evaluate again. Spark's own ``current_timestamp()``
is the driver's clock when the job is planned, and Spark's ``current_date``
follows Spark's session time zone, not PostgreSQL's. So every clock
expression is replaced by a literal (:func:`pin_clock`) of the values
PostgreSQL gives for the snapshot's time in the refresh's own session
(:func:`clock_values`): ``now()``, ``current_timestamp``,
``transaction_timestamp()``, ``statement_timestamp()`` and
``clock_timestamp()`` all become that ``timestamptz``; ``current_date``,
``localtimestamp``, ``current_time`` and ``localtime`` its date, local
timestamp and times in the session time zone. The stream table's
``data_timestamp`` is that same instant.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time

import sqlglot
from sqlglot import exp

TIMESTAMPTZ_FUNCTIONS = frozenset({"now", "clock_timestamp", "statement_timestamp", "transaction_timestamp"})
"""Functions sqlglot keeps by name (or maps to CURRENT_TIMESTAMP) that return the current time."""


@dataclass(frozen=True)
class ClockValues:
    """What the clock reads at one instant, in one session's time zone."""

    timestamptz: datetime
    date: date
    timestamp: datetime
    timetz: time
    time: time


def _is_clock(node: exp.Expr) -> bool:
    if isinstance(
        node, (exp.CurrentTimestamp, exp.CurrentDate, exp.CurrentTime, exp.Localtimestamp, exp.Localtime)
    ):
        return True
    return isinstance(node, exp.Anonymous) and node.name.lower() in TIMESTAMPTZ_FUNCTIONS


def reads_clock(pg_sql: str) -> bool:
    """Whether a PostgreSQL query calls one of the clock functions :func:`pin_clock` replaces."""
    tree = sqlglot.parse_one(pg_sql, read="postgres")
    return any(_is_clock(node) for node in tree.walk())


def _literal(node: exp.Expr, values: ClockValues) -> exp.Expr:
    if isinstance(node, exp.CurrentDate):
        text, kind = values.date.isoformat(), "DATE"
    elif isinstance(node, exp.Localtimestamp):
        text, kind = values.timestamp.isoformat(sep=" "), "TIMESTAMP"
    elif isinstance(node, exp.CurrentTime):
        text, kind = values.timetz.isoformat(), "TIMETZ"
    elif isinstance(node, exp.Localtime):
        text, kind = values.time.isoformat(), "TIME"
    else:
        text, kind = values.timestamptz.isoformat(sep=" "), "TIMESTAMPTZ"
    return exp.Cast(this=exp.Literal.string(text), to=exp.DataType.build(kind, dialect="postgres"))


def pin_clock(pg_sql: str, values: ClockValues) -> str:
    """``pg_sql`` (PostgreSQL) with every clock expression replaced by its value in ``values``."""
    tree = sqlglot.parse_one(pg_sql, read="postgres")
    pinned = tree.transform(lambda node: _literal(node, values) if _is_clock(node) else node)
    return pinned.sql(dialect="postgres")
