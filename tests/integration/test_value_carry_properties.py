"""Property: random values of the risky types cross to Spark exactly, or the refresh is refused.

Each example declares a numeric column with a random precision and scale
(or none), fills it with random values (huge, tiny, NaN, ±Infinity where the
type allows them) beside random times and timestamps with microseconds
(with ``24:00:00`` and infinities now and then), and refreshes a FULL and a
DIFFERENTIAL stream table over it. Whether a value fits is predicted in
Python from docs/TYPES.md; a refresh that completes must pass the two-way
EXCEPT ALL oracle (which compares exactly), and a refresh with an
unfitting value must be refused (ValueNotCarriedError) and change nothing.
``PGTRICKLE_PROPERTY_EXAMPLES`` raises the number of examples (default 4).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgtrickle.errors import ValueNotCarriedError
from pgtrickle.refresh.plan import Action
from tests.conftest import Database
from tests.hypothesis_profiles import examples
from tests.integration.helpers import assert_oracle, create_st, refresh

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.stress]

EXAMPLES = examples(4, "PGTRICKLE_PROPERTY_EXAMPLES")

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
FIRST = datetime(1, 1, 2, tzinfo=timezone.utc)
LAST = datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=timezone.utc)


@st.composite
def numeric_type(draw) -> tuple[int | None, int | None]:  # type: ignore[no-untyped-def]
    if draw(st.booleans()):
        return None, None
    precision = draw(st.integers(1, 60))
    return precision, draw(st.integers(0, precision))


@st.composite
def numeric_value(draw, precision: int | None, scale: int | None) -> str:  # type: ignore[no-untyped-def]
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(["NaN", "Infinity", "-Infinity"] if precision is None else ["NaN"]))
    if precision is None:
        int_digits, frac_digits = draw(st.integers(0, 24)), draw(st.integers(0, 24))
    else:
        assert scale is not None
        int_digits, frac_digits = draw(st.integers(0, precision - scale)), draw(st.integers(0, scale))
    digit = st.sampled_from("0123456789")
    whole = "".join(draw(st.lists(digit, min_size=int_digits, max_size=int_digits))) or "0"
    frac = "".join(draw(st.lists(digit, min_size=frac_digits, max_size=frac_digits)))
    sign = draw(st.sampled_from(["", "-"]))
    return f"{sign}{whole}.{frac}" if frac else f"{sign}{whole}"


def numeric_fits(value: str, precision: int | None, scale: int | None) -> bool:
    if value in ("NaN", "Infinity", "-Infinity"):
        return False
    if precision is not None and precision <= 38 and scale is not None and scale <= precision:
        return True
    d = Decimal(value)
    frac = (value.split(".")[1] if "." in value else "").rstrip("0")  # trailing zeros do not count
    return len(frac) <= 18 and abs(d) < Decimal("1e20")


times = st.one_of(
    st.integers(0, 86_400_000_000 - 1).map(
        lambda us: (datetime(2000, 1, 1) + timedelta(microseconds=us)).time().isoformat()
    ),
    st.just("24:00:00"),
)
instants = st.one_of(
    st.integers(int((FIRST - EPOCH).total_seconds() * 1e6), int((LAST - EPOCH).total_seconds() * 1e6)).map(
        lambda us: (EPOCH + timedelta(microseconds=us)).isoformat()
    ),
    st.sampled_from(
        [
            "infinity",
            "-infinity",
            "10000-01-01 00:00:00+00",
            "0001-01-01 00:00:00+00",
            "1582-10-10T12:00:00.000001+00:00",
        ]
    ),
)


GAP = (datetime(1582, 10, 4, tzinfo=timezone.utc), datetime(1582, 10, 16, tzinfo=timezone.utc))


def instant_fits(value: str) -> bool:
    if value in ("infinity", "-infinity") or value.startswith(("10000-", "0001-01-01 00:00")):
        return False
    return not GAP[0] <= datetime.fromisoformat(value) < GAP[1]


@st.composite
def example(draw):  # type: ignore[no-untyped-def]
    precision, scale = draw(numeric_type())
    rows = draw(st.lists(st.tuples(numeric_value(precision, scale), times, instants), min_size=1, max_size=4))
    return precision, scale, rows


def contents(db: Database, name: str) -> list[tuple]:
    return db.sql(f"SELECT id, n::text, t::text, ts::text FROM {name} ORDER BY id")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=example())
def test_risky_values_cross_exactly_or_are_refused(db: Database, case: tuple) -> None:
    precision, scale, rows = case
    declared = "numeric" if precision is None else f"numeric({precision},{scale})"
    for name in ("st_full", "st_diff"):
        db.sql(
            f"SELECT pgtrickle.drop_stream_table('{name}') FROM pgtrickle.stream_tables_info"
            f" WHERE table_name = '{name}'"
        )
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("DROP TABLE IF EXISTS src")
    db.sql(f"CREATE TABLE src (id int PRIMARY KEY, n {declared}, t time, ts timestamptz)")
    db.sql("INSERT INTO src VALUES (0, 0, '12:00', '2024-02-29 12:00+00')")  # 0 fits any numeric(p,s)
    create_st(db, "st_full", "SELECT id, n, t, ts FROM src", refresh_mode="FULL")
    create_st(db, "st_diff", "SELECT id, n, t, ts FROM src", refresh_mode="DIFFERENTIAL")
    refresh(db, "st_full", "st_diff")
    assert_oracle(db, "st_full", "st_diff")
    for i, (n, t, ts) in enumerate(rows, start=1):
        db.sql("INSERT INTO src VALUES (%s, %s::numeric, %s::time, %s::timestamptz)", (i, n, t, ts))
    fits = all(
        numeric_fits(n, precision, scale) and t != "24:00:00" and instant_fits(ts) for n, t, ts in rows
    )
    for name in ("st_full", "st_diff"):
        before = contents(db, name)
        if fits:
            (outcome,) = refresh(db, name)
            expected = Action.FULL if name == "st_full" else Action.DIFFERENTIAL
            assert outcome.action is expected, outcome.reason
            assert_oracle(db, name)
        else:
            with pytest.raises(ValueNotCarriedError) as err:
                refresh(db, name)
            assert err.value.sqlstate in ("22003", "22008")
            assert "public.src." in str(err.value)
            assert contents(db, name) == before
