"""Exact or loud: a value crosses to Spark and back unaltered, or the refresh is refused.

The reproductions of issue 16 item 6, each in a FULL and a DIFFERENTIAL
refresh, with the two-way EXCEPT ALL oracle (which compares exactly) after
every refresh that completes. A refused refresh raises ValueNotCarriedError
with PostgreSQL's SQLSTATE (22003 numeric, 22008 date/time), names the
column and its type, and leaves the stream table as it was.
"""

from __future__ import annotations

import pytest

from pgtrickle.errors import PgTrickleError, ValueNotCarriedError
from pgtrickle.refresh.plan import Action
from tests.conftest import Database
from tests.integration.helpers import create_st, refresh, refresh_and_check

pytestmark = [pytest.mark.integration, pytest.mark.spark]

MODES = ["FULL", "DIFFERENTIAL"]


@pytest.fixture(autouse=True)
def _differential_stays_differential(db: Database) -> None:
    """Tiny tables: a few rows would otherwise pass differential_fallback_ratio and refresh FULL."""
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")


def contents(db: Database, name: str) -> list[str]:
    return [r[0] for r in db.sql(f"SELECT t::text FROM {name} t ORDER BY 1")]


def start(
    db: Database,
    column_type: str,
    mode: str,
    query: str = "SELECT id, v FROM src",
    first: tuple[str, ...] = (),
) -> None:
    """A source with column ``v`` of ``column_type``, a stream table over it, refreshed once."""
    db.sql(f"CREATE TABLE src (id int PRIMARY KEY, g int NOT NULL DEFAULT 0, v {column_type})")
    for i, value in enumerate(first):
        db.sql("INSERT INTO src (id, v) VALUES (%s, %s)", (i, value))
    create_st(db, "st", query, refresh_mode=mode)
    refresh_and_check(db, "st")


def add(db: Database, *values: str | None, first_id: int = 100) -> None:
    for i, value in enumerate(values):
        db.sql("INSERT INTO src (id, v) VALUES (%s, %s)", (first_id + i, value))


def check(db: Database, mode: str) -> None:
    outcomes = refresh_and_check(db, "st")
    expected = Action.DIFFERENTIAL if mode == "DIFFERENTIAL" else Action.FULL
    assert [o.action for o in outcomes] == [expected]


def assert_refused(db: Database, sqlstate: str, *words: str) -> None:
    before = contents(db, "st")
    with pytest.raises(ValueNotCarriedError) as err:
        refresh(db, "st")
    assert err.value.sqlstate == sqlstate
    for word in words:
        assert word in str(err.value), str(err.value)
    assert contents(db, "st") == before, "a refused refresh must change nothing"
    last = db.sql(
        "SELECT status, error_message FROM pgtrickle.pgt_refresh_history ORDER BY refresh_id DESC LIMIT 1"
    )
    assert last[0][0] == "FAILED" and words[0] in last[0][1], last


# ------------------------------------------------------------------ numeric


@pytest.mark.parametrize("mode", MODES)
def test_unconstrained_numeric_within_decimal_38_18_is_exact(db: Database, mode: str) -> None:
    start(db, "numeric", mode, first=("1.5",))
    add(db, "0.123456789012345678", "-99999999999999999999.999999999999999999", "1.50", "0", None)
    check(db, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "value",
    ["0.1234567890123456789012345", "1e-20", "123456789012345678901234.5", "NaN", "Infinity", "-Infinity"],
)
def test_unconstrained_numeric_beyond_decimal_38_18_is_refused(db: Database, mode: str, value: str) -> None:
    start(db, "numeric", mode, first=("1.5",))
    add(db, value)
    assert_refused(db, "22003", "public.src.v", "(numeric)", "numeric(p,s)")
    db.sql("DELETE FROM src WHERE id >= 100")
    refresh_and_check(db, "st")


@pytest.mark.parametrize("mode", MODES)
def test_arithmetic_on_unconstrained_numeric_keeps_every_digit(db: Database, mode: str) -> None:
    """Unconstrained numeric crosses as decimal(38,18); Spark's default would round ``v + 1``
    (decimal(39,18) → decimal(38,17)) and ``v * 2`` to fewer fraction digits, silently. The
    results keep their scale."""
    query = "SELECT id, v + 1 AS plus, v * 2 AS twice, v - 0.5 AS less FROM src"
    start(db, "numeric", mode, query, first=("12345.000000000000000001",))
    add(db, "-0.000000000000000001", "99999999999999999.999999999999999999")
    check(db, mode)
    assert db.sql("SELECT plus::text, twice::text, less::text FROM st WHERE id = 0") == [
        ("12346.000000000000000001", "24690.000000000000000002", "12344.500000000000000001")
    ]


@pytest.mark.parametrize("mode", MODES)
def test_a_result_with_more_digits_than_spark_holds_fails_the_refresh_loudly(db: Database, mode: str) -> None:
    """``v * v`` of two decimal(38,18) is decimal(38,36) for Spark: 12345.5 squared does not fit.
    The refresh fails saying so (SQLSTATE 22003) and changes nothing - never a rounded value."""
    start(db, "numeric", mode, "SELECT id, v * v AS square FROM src", first=("1.25",))
    add(db, "12345.5")
    before = contents(db, "st")
    with pytest.raises(PgTrickleError) as err:
        refresh(db, "st")
    assert "NUMERIC_VALUE_OUT_OF_RANGE" in str(err.value) or "22003" in str(err.value), str(err.value)
    assert contents(db, "st") == before
    db.sql("DELETE FROM src WHERE id >= 100")
    refresh_and_check(db, "st")


@pytest.mark.parametrize("mode", MODES)
def test_numeric_declared_with_its_scale_carries_every_digit(db: Database, mode: str) -> None:
    """The refusal's hint works: numeric(38,25) crosses as decimal(38,25)."""
    start(db, "numeric(38,25)", mode, first=("1.5",))
    add(db, "0.1234567890123456789012345", "1e-20", "-1234567890123.0000000000000000000000001")
    check(db, mode)


@pytest.mark.parametrize("mode", MODES)
def test_sum_over_unconstrained_numeric_is_exact_or_refused(db: Database, mode: str) -> None:
    query = "SELECT g, sum(v) AS s, count(*) AS n FROM src GROUP BY g"
    start(db, "numeric", mode, query, first=("0.000000000000000001", "12345678901234567890.5"))
    add(db, "0.000000000000000002", "-0.5")
    check(db, mode)
    add(db, "1e-20", first_id=200)
    assert_refused(db, "22003", "public.src.v")


@pytest.mark.parametrize("mode", MODES)
def test_numeric_beyond_38_digits_of_precision_and_negative_scale(db: Database, mode: str) -> None:
    db.sql("CREATE TABLE other (id int PRIMARY KEY, w numeric(50,2), n numeric(5,-2))")
    db.sql("INSERT INTO other VALUES (1, 123.45, 12300)")
    create_st(db, "st", "SELECT id, w AS v, n FROM other", refresh_mode=mode)
    refresh_and_check(db, "st")
    db.sql("INSERT INTO other VALUES (2, 12345678901234567890.25, -99900)")
    check(db, mode)
    db.sql("CREATE TABLE wide (id int PRIMARY KEY, v numeric(39,19))")  # scale 19: its trailing zeros fit
    db.sql("INSERT INTO wide VALUES (1, 1), (2, 0.123456789012345678)")
    create_st(db, "wide_st", "SELECT id, v FROM wide", refresh_mode=mode)
    refresh_and_check(db, "wide_st")
    db.sql("INSERT INTO other VALUES (3, 123456789012345678901234567890.25, 0)")
    assert_refused(db, "22003", "public.other.w", "numeric(50,2)")


@pytest.mark.parametrize("mode", MODES)
def test_numeric_domain_is_checked_as_its_base_type(db: Database, mode: str) -> None:
    db.sql("CREATE DOMAIN amount AS numeric CHECK (VALUE > 0)")
    start(db, "amount", mode, first=("1.5",))
    add(db, "0.5")
    check(db, mode)
    add(db, "0.1234567890123456789012345", first_id=200)
    assert_refused(db, "22003", "public.src.v", "(numeric)")


# -------------------------------------------------------------- time of day


@pytest.mark.parametrize("mode", MODES)
def test_time_keeps_its_microseconds(db: Database, mode: str) -> None:
    start(db, "time", mode, first=("12:00:00",))
    add(db, "23:59:59.999999", "00:00:00.000001", "00:00:00", None)
    check(db, mode)
    assert db.scalar("SELECT v::text FROM st WHERE id = 100") == "23:59:59.999999"
    add(db, "24:00:00", first_id=200)
    assert_refused(db, "22008", "public.src.v", "time without time zone")


@pytest.mark.parametrize("mode", MODES)
def test_time_with_time_zone_keeps_offset_and_microseconds(db: Database, mode: str) -> None:
    start(db, "timetz", mode, first=("12:00:00+00",))
    add(db, "23:59:59.999999+05:30", "00:00:00.000001-11")
    check(db, mode)
    assert db.scalar("SELECT v::text FROM st WHERE id = 100") == "23:59:59.999999+05:30"


@pytest.mark.parametrize("mode", MODES)
def test_time_as_a_group_key(db: Database, mode: str) -> None:
    query = "SELECT v, count(*) AS n FROM src GROUP BY v"
    start(db, "time", mode, query, first=("12:00:00.000001", "12:00:00.000002"))
    add(db, "23:59:59.999999", "23:59:59.999999", "12:00:00.000002")
    check(db, mode)


# ---------------------------------------------------- dates and timestamps


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("column_type", "value"),
    [
        ("timestamptz", "infinity"),
        ("timestamptz", "-infinity"),
        ("timestamptz", "12000-01-01 00:00:00+00"),
        ("timestamptz", "0044-03-15 12:00:00 BC"),
        ("timestamp", "infinity"),
        ("timestamp", "0044-03-15 12:00 BC"),
        ("timestamp", "12000-01-01"),
        ("date", "infinity"),
        ("date", "-infinity"),
        ("date", "0044-03-15 BC"),
        ("date", "12000-01-01"),
        # Java's calendar skips these ten days: the driver would move them ten days on.
        ("date", "1582-10-10"),
        ("timestamp", "1582-10-05 00:00"),
        ("timestamptz", "1582-10-14 23:00+00"),
    ],
)
def test_infinite_and_out_of_range_datetimes_are_refused(
    db: Database, mode: str, column_type: str, value: str
) -> None:
    start(db, column_type, mode, first=("2024-02-29",))
    add(db, "2024-02-29 23:59:59.999999" if column_type != "date" else "0001-01-01")
    check(db, mode)
    add(db, value, first_id=200)
    assert_refused(db, "22008", "public.src.v", column_type if column_type == "date" else "timestamp")
    db.sql("DELETE FROM src WHERE id = 200")
    refresh_and_check(db, "st")


@pytest.mark.parametrize("mode", MODES)
def test_timestamps_at_the_edges_of_the_range_are_exact(db: Database, mode: str) -> None:
    start(db, "timestamptz", mode, first=("2024-02-29 12:00+00",))
    add(
        db,
        "0001-01-02 00:00:00+00",
        "9999-12-30 23:59:59.999999+00",
        "1582-10-03 10:00:00.000001+00",
        "1582-10-16 00:00+00",
        "1000-02-28 00:00+00",
        "0200-03-01 00:00+00",
    )
    check(db, mode)


# ---------------------------------------------------------------- bit strings


@pytest.mark.parametrize("mode", MODES)
def test_bit_strings_pass_through(db: Database, mode: str) -> None:
    start(db, "bit(3)", mode, first=("000",))
    add(db, "101", "111")
    check(db, mode)
