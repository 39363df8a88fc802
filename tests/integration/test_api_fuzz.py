"""Hypothesis drives the SQL API with arbitrary arguments.

Every call either works or fails with a PostgreSQL error that has a message
and an SQLSTATE outside the internal-error class (``XX``); a failed call
leaves the catalog, the relations, the triggers and the capture functions
exactly as they were, and a call that worked is undone by dropping what it
made — back to the same fingerprint. Nothing half-creates a stream table.
"""

from __future__ import annotations

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.hypothesis_profiles import examples
from tests.integration.helpers import catalog_fingerprint

pytestmark = [pytest.mark.integration, pytest.mark.stress]

EXAMPLES = examples(150, "PGTRICKLE_FUZZ_EXAMPLES")

text = st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=80)
good_names = st.sampled_from(["s", "S", 'we"ird', "a;b", "public.s", "x" * 63, "s; DROP TABLE orders", "Ünï"])
names = st.one_of(
    good_names,
    good_names,
    st.none(),
    text,
    st.sampled_from(["nope.s", "x" * 70, "", " ", "orders", "pg_class", "pgtrickle.s", '"quoted".s']),
)
GOOD_QUERIES = [
    "SELECT id FROM orders",
    "SELECT customer, count(*) AS n FROM orders GROUP BY customer",
    "SELECT id FROM orders ORDER BY id LIMIT 3",
    "SELECT o.id, o.amount * 2 AS a FROM orders o",
]
BAD_QUERIES = [
    "DELETE FROM orders",
    "SELECT 1; DROP TABLE orders",
    "SELECT * FROM no_such_table",
    "SELECT now() AS t FROM orders",
    "",
    "SELECT",
    "VALUES (1)",
    "WITH x AS (DELETE FROM orders RETURNING id) SELECT id FROM x",
    "SELECT id FROM orders FOR UPDATE",
]
queries = st.one_of(
    st.sampled_from(GOOD_QUERIES),
    st.sampled_from(GOOD_QUERIES),
    st.none(),
    text,
    st.sampled_from(BAD_QUERIES),
)
schedules = st.one_of(
    st.none(),
    st.sampled_from(["30s", "5m", "1h", "*/5 * * * *", "calculated", "@hourly"]),
    text,
    st.sampled_from(["0s", "-1m", "1000000d", "61 * * * *", "often"]),
)
good_modes = st.sampled_from(["AUTO", "FULL", "DIFFERENTIAL", "full"])
modes = st.one_of(good_modes, good_modes, st.none(), text, st.sampled_from(["bogus", ""]))
statuses = st.one_of(
    st.none(), text, st.sampled_from(["ACTIVE", "SUSPENDED", "ERROR", "INITIALIZING", "paused"])
)
consistencies = st.one_of(st.none(), text, st.sampled_from(["atomic", "none", " ATOMIC ", "both"]))
members = st.one_of(
    st.none(),
    st.lists(st.one_of(names, st.sampled_from(["s", "t", "public.t"])), max_size=4),
    st.sampled_from([["s", "t"], ["t", "s"], ["s", "public.t"]]),
)

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
def shop(db):  # type: ignore[no-untyped-def]
    db.sql("CREATE TABLE orders (id int PRIMARY KEY, customer text, amount numeric)")
    db.sql("INSERT INTO orders SELECT g, 'c' || (g % 3), g FROM generate_series(1, 10) g")
    return db


def _call(db, statement: str, params: tuple) -> psycopg.Error | None:  # type: ignore[no-untyped-def]
    try:
        db.sql(statement, params)
    except psycopg.Error as err:
        assert err.sqlstate is not None and not err.sqlstate.startswith("XX"), (err.sqlstate, str(err))
        assert str(err).strip(), "an error without a message"
        return err
    return None


def test_create_stream_table_with_arbitrary_arguments(shop) -> None:  # type: ignore[no-untyped-def]
    made: list[str] = []

    @FUZZ
    @given(name=names, query=queries, schedule=schedules, mode=modes)
    def run(name, query, schedule, mode) -> None:  # type: ignore[no-untyped-def]
        before = catalog_fingerprint(shop)
        error = _call(
            shop,
            "SELECT pgtrickle.create_stream_table(%s, %s, schedule => %s, refresh_mode => %s, "
            "initialize => false)",
            (name, query, schedule, mode),
        )
        if error is None:
            # It worked: a real stream table, and dropping it restores everything.
            assert shop.scalar("SELECT count(*) FROM pgtrickle.pgt_stream_tables") == 1
            made.append(name)
            shop.sql("SELECT pgtrickle.drop_stream_table(%s)", (name,))
        assert catalog_fingerprint(shop) == before
        assert shop.scalar("SELECT count(*) FROM orders") == 10

    run()
    assert made, "no example created a stream table: the strategies only try failures"


@FUZZ
@given(name=names, schedule=schedules, mode=modes, status=statuses, consistency=consistencies)
def test_alter_stream_table_with_arbitrary_arguments(
    shop,
    name,
    schedule,
    mode,
    status,  # type: ignore[no-untyped-def]
    consistency,
) -> None:
    if not shop.scalar("SELECT count(*) FROM pgtrickle.pgt_stream_tables"):
        shop.sql(
            "SELECT pgtrickle.create_stream_table('s', 'SELECT customer, count(*) AS n FROM orders "
            "GROUP BY customer', schedule => '1m', initialize => false)"
        )
    before = catalog_fingerprint(shop)
    error = _call(
        shop,
        "SELECT pgtrickle.alter_stream_table(%s, schedule => %s, refresh_mode => %s, status => %s,"
        " diamond_consistency => %s)",
        (name, schedule, mode, status, consistency),
    )
    if error is not None:
        assert catalog_fingerprint(shop) == before
    else:
        # Whatever it changed, the stream table is still one coherent catalog row.
        row = shop.sql("SELECT refresh_mode, status, diamond_consistency FROM pgtrickle.pgt_stream_tables")
        assert len(row) == 1 and row[0][0] in ("AUTO", "FULL", "DIFFERENTIAL")
        assert row[0][1] in ("INITIALIZING", "ACTIVE", "SUSPENDED", "ERROR")
        assert row[0][2] in ("atomic", "none")


@FUZZ
@given(name=names)
def test_refresh_and_drop_with_arbitrary_names(shop, name) -> None:  # type: ignore[no-untyped-def]
    if not shop.scalar("SELECT count(*) FROM pgtrickle.pgt_stream_tables"):
        shop.sql("SELECT pgtrickle.create_stream_table('s', 'SELECT id FROM orders', initialize => false)")
    before = catalog_fingerprint(shop)
    for statement in ("SELECT pgtrickle.drop_stream_table(%s)", "SELECT pgtrickle.refresh_stream_table(%s)"):
        if _call(shop, statement, (name,)) is not None:
            assert catalog_fingerprint(shop) == before
        else:
            return  # a real name ('s'): the call did its job


def test_refresh_groups_with_arbitrary_arguments(shop) -> None:  # type: ignore[no-untyped-def]
    shop.sql("SELECT pgtrickle.create_stream_table('s', 'SELECT id FROM orders', initialize => false)")
    shop.sql(
        "SELECT pgtrickle.create_stream_table('t', 'SELECT count(*) AS n FROM orders', initialize => false)"
    )
    made: list[str] = []

    def state():  # type: ignore[no-untyped-def]
        return catalog_fingerprint(shop), shop.sql("SELECT * FROM pgtrickle.refresh_groups ORDER BY 1")

    @FUZZ
    @given(name=names, group_members=members)
    def run(name, group_members) -> None:  # type: ignore[no-untyped-def]
        before = state()
        if _call(shop, "SELECT pgtrickle.create_refresh_group(%s, %s)", (name, group_members)) is None:
            assert len(shop.sql("SELECT * FROM pgtrickle.refresh_groups")) == 1
            made.append(name)
            shop.sql("SELECT pgtrickle.drop_refresh_group(%s)", (name,))
        assert state() == before
        assert _call(shop, "SELECT pgtrickle.drop_refresh_group(%s)", (name,)) is not None
        assert state() == before

    run()
    assert made, "no example created a refresh group: the strategies only try failures"
