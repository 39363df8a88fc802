"""pin_clock / reads_clock: the clock expressions of a query, pinned to one instant (pure)."""

from __future__ import annotations

from datetime import UTC, date, datetime, time

from pgtrickle.sql.clock import ClockValues, pin_clock, reads_clock
from pgtrickle.sql.translate import translate_to_spark

VALUES = ClockValues(
    datetime(2026, 11, 26, 15, 0, 0, 123456, tzinfo=UTC),
    date(2026, 11, 26),
    datetime(2026, 11, 26, 15, 0, 0, 123456),
    time(15, 0, tzinfo=UTC),
    time(15, 0),
)
TS = "'2026-11-26 15:00:00.123456+00:00'"


def test_every_clock_spelling_is_found() -> None:
    for expr in (
        "now()",
        "current_timestamp",
        "current_timestamp(3)",
        "current_date",
        "localtimestamp",
        "clock_timestamp()",
        "statement_timestamp()",
        "transaction_timestamp()",
        "NOW()",
    ):
        assert reads_clock(f"SELECT id FROM t WHERE ts < {expr}"), expr


def test_names_and_strings_are_not_the_clock() -> None:
    assert not reads_clock("SELECT \"now\", 'now()' AS label, current_user FROM t")


def test_pinned_query_has_no_clock_left_and_the_same_instant_everywhere() -> None:
    query = (
        "SELECT id FROM public.ev WHERE ts > now() - '00:00:20'::interval AND ts < clock_timestamp()"
        " AND d = CURRENT_DATE AND ts::timestamp <= LOCALTIMESTAMP AND ts < CURRENT_TIMESTAMP(3)"
    )
    pinned = pin_clock(query, VALUES)
    assert not reads_clock(pinned)
    assert pinned.count(f"CAST({TS} AS TIMESTAMPTZ)") == 3
    assert "CAST('2026-11-26' AS DATE)" in pinned
    assert "CAST('2026-11-26 15:00:00.123456' AS TIMESTAMP)" in pinned


def test_the_pinned_query_translates_to_spark_with_literals() -> None:
    pinned = pin_clock("SELECT id FROM public.ev WHERE ts > now() - '00:00:03'::interval", VALUES)
    spark = translate_to_spark(
        pinned,
        {("public", "ev"): "pgt_src_1"},
        {("public", "ev"): {"id": "integer", "ts": "timestamp with time zone"}},
    )
    assert "CURRENT_TIMESTAMP" not in spark.upper() and "2026-11-26 15:00:00.123456+00:00" in spark
