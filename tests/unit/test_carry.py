"""spark/carry.py: the pure decision of how each PostgreSQL type crosses to Spark, and its SQL."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from psycopg import sql

from pgtrickle.db.instants import FAR_FUTURE, FAR_PAST, parse_instant
from pgtrickle.spark import carry

CASES = [
    ("integer", carry.NATIVE, None),
    ("bigint", carry.NATIVE, None),
    ("double precision", carry.NATIVE, None),
    ("real", carry.NATIVE, None),
    ("money", carry.NATIVE, None),
    ("text", carry.NATIVE, None),
    ("character(5)", carry.RECARRIED, "text"),
    ("bytea", carry.NATIVE, None),
    ("interval", carry.NATIVE, None),
    ("jsonb", carry.NATIVE, None),
    ("integer[]", carry.NATIVE, None),
    ("bit varying", carry.NATIVE, None),
    ("public.mood", carry.NATIVE, None),
    ("numeric(10,2)", carry.CHECKED, "numeric(10,2)"),
    ("numeric(38,30)", carry.CHECKED, "numeric(38,30)"),
    ("numeric(5,0)", carry.CHECKED, "numeric(5,0)"),
    ("numeric", carry.CHECKED, "numeric"),
    ("numeric(39,2)", carry.CHECKED, "numeric"),
    ("numeric(50,2)", carry.CHECKED, "numeric"),
    ("numeric(5,-2)", carry.CHECKED, "numeric"),
    ("numeric(3,5)", carry.CHECKED, "numeric"),
    ("date", carry.CHECKED, None),
    ("timestamp without time zone", carry.CHECKED, None),
    ("timestamp(3) without time zone", carry.CHECKED, None),
    ("timestamp with time zone", carry.CHECKED, None),
    ("time without time zone", carry.RECARRIED, "timestamp without time zone"),
    ("time(3) without time zone", carry.RECARRIED, "timestamp without time zone"),
    ("time with time zone", carry.RECARRIED, "text"),
    ("bit(3)", carry.RECARRIED, "text"),
    ("bit", carry.RECARRIED, "text"),
]


@pytest.mark.parametrize(("type_name", "kind", "read_as"), CASES)
def test_decide(type_name: str, kind: str, read_as: str | None) -> None:
    decision = carry.decide(type_name)
    assert (decision.kind, decision.read_as) == (kind, read_as)
    if decision.test:
        assert decision.sqlstate in carry.REFUSAL_SQLSTATES and decision.hint


def test_unconstrained_numeric_is_checked_against_decimal_38_18() -> None:
    decision = carry.decide("numeric")
    assert decision.test == "min_scale({c}) <= 18 AND abs({c}) < 1e20"
    assert decision.sqlstate == "22003"
    assert "numeric(p,s)" in (decision.hint or "")


def test_datetimes_are_refused_with_22008() -> None:
    for name in ("date", "timestamp without time zone", "timestamp with time zone", "time without time zone"):
        assert carry.decide(name).sqlstate == "22008"


def test_native_columns_are_read_as_they_are() -> None:
    expr = carry.read_expression(sql.Identifier("id"), "integer", "public.t.id")
    assert expr.as_string(None) == '"id"'


def test_checked_column_names_itself_and_keeps_its_type() -> None:
    text = carry.read_expression(sql.Identifier("v"), "numeric(10,2)", "public.t.v").as_string(None)
    assert text.startswith('(CASE WHEN "v" IS NULL OR ("v" <> \'NaN\'::numeric) THEN "v" ELSE ')
    assert "pgtrickle._value_not_carried(\"v\", 'public.t.v', 'numeric(10,2)', '22003'" in text
    assert text.endswith(")::numeric(10,2)")


def test_time_is_read_as_a_timestamp_on_the_epoch_day() -> None:
    text = carry.read_expression(sql.Identifier("t"), "time without time zone", "s.t.t").as_string(None)
    assert "THEN ('1970-01-01'::date + \"t\") ELSE " in text
    assert "ELSE ('1970-01-01'::date + pgtrickle._value_not_carried(" in text
    assert text.endswith(")::timestamp without time zone")


def test_select_list_reads_from_buffer_columns_under_source_names() -> None:
    text = carry.select_list(
        [("id", "integer"), ("b", "bit(3)")], "public.t", {"id": "new_c1", "b": "new_c2"}
    ).as_string(None)
    assert text == '"new_c1" AS "id", "new_c2"::text AS "b"'


def test_hostile_names_are_quoted_and_labels_are_literals() -> None:
    text = carry.select_list([('x"; DROP TABLE t; --', "date")], "public.t'x").as_string(None)
    assert '"x""; DROP TABLE t; --"' in text
    assert "'public.t''x.x\"; DROP TABLE t; --'" in text


def test_needs_care() -> None:
    assert not carry.needs_care({"a": "integer", "b": "text"})
    assert carry.needs_care({"a": "integer", "b": "numeric"})


def test_refusal_in_ignores_other_errors() -> None:
    assert carry.refusal_in(ValueError("nope")) is None
    assert carry.refusal_in(RuntimeError("ERROR: column x holds 1, which Spark cannot carry")) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-03-01T12:00:00+00:00", datetime(2026, 3, 1, 12, tzinfo=timezone.utc)),
        ("12000-01-01T00:00:00+00:00", FAR_FUTURE),
        ("infinity", FAR_FUTURE),
        ("-infinity", FAR_PAST),
        ("0044-03-15T00:00:00+00:00 BC", FAR_PAST),
        ("-0043-03-15T00:00:00+00:00", FAR_PAST),
    ],
)
def test_parse_instant_never_raises(text: str, expected: datetime) -> None:
    assert parse_instant(text) == expected
