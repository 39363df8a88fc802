"""Reading the clock values a refresh pins (:mod:`pgtrickle.sql.clock`) from PostgreSQL."""

from __future__ import annotations

from datetime import datetime

import psycopg

from pgtrickle.sql.clock import ClockValues


def clock_values(conn: psycopg.Connection, at: datetime | None = None) -> ClockValues:
    """The clock values at ``at`` (default: ``now()`` of ``conn``'s transaction) in ``conn``'s time zone."""
    row = conn.execute(
        "SELECT t, t::date, t::timestamp, t::timetz, t::time FROM (SELECT coalesce(%s::timestamptz, now()) AS t) s",
        (at,),
    ).fetchone()
    assert row is not None
    return ClockValues(*row)
