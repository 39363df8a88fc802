"""PostgreSQL's numeric division: the pure function against the server itself, and the refreshes.

``pgtrickle.sql.numeric_division.divide`` must print exactly what ``SELECT a / b`` prints, and
every stream table holding a quotient (FULL and DIFFERENTIAL) must equal its defining query
(two-way EXCEPT ALL), or refuse the refresh with SQLSTATE 22003 and keep its contents.
"""

from __future__ import annotations

import random
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pgtrickle.errors import ValueNotCarriedError
from pgtrickle.refresh.plan import Action
from pgtrickle.sql.numeric_division import divide
from pgtrickle.sql.numeric_scale import quotient_type
from tests.conftest import Database
from tests.hypothesis_profiles import examples
from tests.integration.helpers import create_st, refresh, refresh_and_check

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _random_numeric(rng: random.Random) -> str:
    integer_digits = rng.choice([0, 0, 1, 2, 4, 5, 8, 12, 20])
    scale = rng.choice([0, 0, 1, 2, 3, 4, 5, 8, 17, 25])
    digits = "".join(rng.choice("0123456789") for _ in range(integer_digits)) or "0"
    fraction = "".join(rng.choice("0123456789") for _ in range(scale))
    sign = rng.choice(["", "", "-"])
    return f"{sign}{digits}.{fraction}" if scale else f"{sign}{digits}"


def _scale(text: str) -> int:
    return len(text.split(".")[1]) if "." in text else 0


def test_pure_division_prints_what_postgresql_prints(db: Database) -> None:
    rng = random.Random(20261127)
    pairs = []
    while len(pairs) < 3000:
        a, b = _random_numeric(rng), _random_numeric(rng)
        if Decimal(b) != 0:
            pairs.append((a, b))
    pairs += [("1", "3"), ("0", "7"), ("1.7", "1.5"), ("-1", "8"), ("0.0000000000000000000000000001", "3")]
    pairs += [
        ("0.000000000000000000000000000001", "3"),
        ("99999999999999999999", "0.0001"),
        ("12345.6", "0.001"),
    ]
    pairs += [("123456789012345678901234567890", "7"), ("12345678901234567890123456789012345678", "3")]
    rows = db.sql(
        "SELECT a, b, (a::numeric / b::numeric)::text FROM unnest(%s::text[], %s::text[]) AS t(a, b)",
        ([a for a, _ in pairs], [b for _, b in pairs]),
    )
    wrong = [
        (a, b, expected, format(divide(Decimal(a), Decimal(b), _scale(a), _scale(b)), "f"))
        for a, b, expected in rows
        if format(divide(Decimal(a), Decimal(b), _scale(a), _scale(b)), "f") != expected
    ]
    assert not wrong, wrong[:10]


# ------------------------------------------------------------------ stream tables

MODES = ["FULL", "DIFFERENTIAL"]

QUERIES = {
    "ratio": "SELECT g, sum(a) / sum(b) AS r, avg(a) AS av, avg(q) AS aq, count(*) AS n FROM src GROUP BY g",
    "per_row": "SELECT id, a / b AS r, round(a / b, 2) AS r2, a / b > 0.5 AS big, a / q AS aq FROM src"
    " WHERE b <> 0 AND q <> 0",
    "nested": "SELECT g, sum(a / b) AS s, max((a / b) / 7) AS m FROM src WHERE b <> 0 GROUP BY g",
    "guarded": "SELECT id, CASE WHEN b <> 0 THEN a / b END AS r FROM src",
    "scalar": "SELECT avg(a) AS av, sum(a) / 7.0 AS s7 FROM src",
    # a stored aggregate: DIFFERENTIAL merges each AVG's hidden sum and count in PostgreSQL
    "stored": "SELECT g, avg(a) AS av, avg(q) AS aq FROM src GROUP BY g",
}


@pytest.fixture(autouse=True)
def _differential_stays_differential(db: Database) -> None:
    """Tiny tables: a few rows would otherwise pass differential_fallback_ratio and refresh FULL."""
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")


def _source(db: Database) -> None:
    db.sql(
        "CREATE TABLE src (id int PRIMARY KEY, g int NOT NULL, a numeric(12,2) NOT NULL,"
        " b numeric(10,3) NOT NULL, q int NOT NULL)"
    )


def _insert(db: Database, rng: random.Random, ids: range) -> None:
    for i in ids:
        db.sql(
            "INSERT INTO src VALUES (%s, %s, %s, %s, %s)",
            (i, rng.randrange(4), _value(rng, 9, 2), _value(rng, 6, 3), rng.randrange(-3, 30)),
        )


def _value(rng: random.Random, digits: int, scale: int) -> str:
    magnitude = rng.choice([0, 1, 2, 3, digits])
    unscaled = rng.randrange(10 ** (magnitude + scale))
    text = str(Decimal(unscaled).scaleb(-scale))
    return ("-" if rng.random() < 0.3 else "") + text


def _check(db: Database, mode: str, names: list[str]) -> None:
    outcomes = refresh_and_check(db, *names)
    expected = Action.DIFFERENTIAL if mode == "DIFFERENTIAL" else Action.FULL
    assert {o.action for o in outcomes} == {expected}, outcomes


@pytest.mark.parametrize("mode", MODES)
def test_quotients_equal_postgresql_under_changes(db: Database, mode: str) -> None:
    rng = random.Random(17)
    _source(db)
    _insert(db, rng, range(40))
    for name, query in QUERIES.items():
        create_st(db, name, query, refresh_mode=mode)
    refresh_and_check(db, *QUERIES)
    for round_ in range(3):
        _insert(db, rng, range(100 + 10 * round_, 105 + 10 * round_))
        db.sql("UPDATE src SET a = a + 0.07, b = b * 3 WHERE id %% 5 = %s", (round_,))
        db.sql("DELETE FROM src WHERE id %% 11 = %s", (round_,))
        _check(db, mode, list(QUERIES))


# ------------------------------------------------------------------ refusals


def _contents(db: Database, name: str) -> list[str]:
    return [r[0] for r in db.sql(f"SELECT t::text FROM {name} t ORDER BY 1")]


def _assert_refused(db: Database, name: str, *words: str) -> None:
    before = _contents(db, name)
    with pytest.raises(ValueNotCarriedError) as err:
        refresh(db, name)
    assert err.value.sqlstate == "22003"
    for word in words:
        assert word in str(err.value), str(err.value)
    assert _contents(db, name) == before, "a refused refresh must change nothing"


@pytest.mark.parametrize("mode", MODES)
def test_quotient_beyond_its_spark_type_is_refused(db: Database, mode: str) -> None:
    db.sql("CREATE TABLE big (id int PRIMARY KEY, a numeric(30,0), b numeric(5,0))")
    db.sql("INSERT INTO big VALUES (1, 10, 3)")
    create_st(db, "st", "SELECT id, a / b AS r FROM big", refresh_mode=mode)
    refresh_and_check(db, "st")
    # 10^25 / 1 has 26 integer digits; the quotient's type (38 digits, 20 of them fractional)
    # holds 18: refused, naming the expression, rather than rounded.
    db.sql("INSERT INTO big VALUES (2, 1e25, 1)")
    _assert_refused(db, "st", "a / b", "does not fit")
    db.sql("DELETE FROM big WHERE id = 2")
    refresh_and_check(db, "st")


@pytest.mark.parametrize("mode", MODES)
def test_unconstrained_numeric_quotient_is_exact_or_refused(db: Database, mode: str) -> None:
    """An unconstrained numeric's display scale is not carried to Spark (it arrives as
    decimal(38,18)): a quotient is exact when every possible scale gives the same value."""
    db.sql("CREATE TABLE u (id int PRIMARY KEY, x numeric)")
    db.sql("INSERT INTO u VALUES (1, 1), (2, 0.5), (3, 0.25)")
    create_st(db, "st", "SELECT id, x / 3 AS third, x / 4 AS quarter FROM u", refresh_mode=mode)
    # Quotients below 1 take 20 digits from the weights (more than the 18 Spark carries): exact.
    refresh_and_check(db, "st")
    # 5/3 has 16 digits at display scale 0 but 18 at 18: which one PostgreSQL prints depends on
    # the scale the value was stored with.
    db.sql("INSERT INTO u VALUES (4, 5)")
    _assert_refused(db, "st", "x / CAST(3 AS DECIMAL)", "display scale")
    db.sql("UPDATE u SET x = x::numeric(10,0) / 1000 WHERE id = 4")  # 0.005: 20 digits again
    refresh_and_check(db, "st")


# ------------------------------------------------------------------ property

EXAMPLES = examples(3, "PGTRICKLE_PROPERTY_EXAMPLES")


@st.composite
def _case(draw):  # type: ignore[no-untyped-def]
    types = [(p, draw(st.integers(0, p))) for p in (draw(st.integers(1, 16)), draw(st.integers(1, 16)))]

    def value(p: int, s: int) -> st.SearchStrategy[str]:
        return st.integers(-(10**p) + 1, 10**p - 1).map(lambda n: str(Decimal(n).scaleb(-s)))

    def rows(n: int) -> st.SearchStrategy[list]:
        return st.lists(
            st.tuples(st.integers(0, 2), value(*types[0]), value(*types[1])), min_size=1, max_size=n
        )

    changes = st.lists(
        st.tuples(st.sampled_from(["insert", "update", "delete"]), rows(3)), min_size=1, max_size=3
    )
    return types, draw(rows(6)), draw(changes)


def _fits(db: Database, query: str, column: str, integer_digits: int, scale: int) -> bool:
    """Whether every quotient PostgreSQL computes fits the Spark type the translation chose: its
    value, that is — zeros beyond the type's scale are not digits Spark must hold (``0 / 9999999999999``
    is 0 with display scale 28 in PostgreSQL, and is carried)."""
    row = db.sql(
        f"SELECT coalesce(max(min_scale({column})), 0), coalesce(max(length(trunc(abs({column}))::text)), 0)"
        f" FROM ({query}) q"
    )[0]
    return row[0] <= scale and (row[1] <= integer_digits or row[1] == 1)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_case())
# 0 / -9999999999999 has display scale 28 in PostgreSQL; the value 0 fits decimal(38,20) and is carried.
@example(case=([(1, 0), (13, 0)], [(0, "0", "-9999999999999")], [("insert", [(0, "0", "0")])]))
def test_random_numerics_and_changes_are_exact_or_refused(db: Database, case: tuple) -> None:
    (pa, sa), (pb, sb) = types = case[0]
    first, changes = case[1], case[2]
    queries = {
        "per_row": "SELECT id, a / b AS r FROM src WHERE b <> 0",
        "grouped": "SELECT g, avg(a) AS r, sum(a) / sum(b) AS s FROM src GROUP BY g HAVING sum(b) <> 0",
    }
    shapes = {  # (query, column) -> the (integer digits, scale) the translation picks
        ("per_row", "r"): quotient_type((pa - sa, sa), (pb - sb, sb), pa - sa + sb),
        ("grouped", "r"): quotient_type((None, sa), (19, 0), pa - sa),
        ("grouped", "s"): quotient_type((None, sa), (None, sb), None),
    }
    names = [f"{q}_{m.lower()}" for q in queries for m in MODES]
    for name in names:
        db.sql(
            f"SELECT pgtrickle.drop_stream_table('{name}') FROM pgtrickle.stream_tables_info"
            f" WHERE table_name = '{name}'"
        )
    db.sql("DROP TABLE IF EXISTS src")
    db.sql(f"CREATE TABLE src (id serial PRIMARY KEY, g int, a numeric({pa},{sa}), b numeric({pb},{sb}))")
    for g, a, b in first:
        db.sql("INSERT INTO src (g, a, b) VALUES (%s, %s, %s)", (g, a, b))
    for query, sql_text in queries.items():
        for mode in MODES:
            create_st(db, f"{query}_{mode.lower()}", sql_text, refresh_mode=mode, initialize=False)
    del types
    for step in [None, *changes]:
        if step is not None:
            kind, values = step
            for g, a, b in values:
                if kind == "insert":
                    db.sql("INSERT INTO src (g, a, b) VALUES (%s, %s, %s)", (g, a, b))
                elif kind == "update":
                    db.sql(
                        "UPDATE src SET a = %s, b = %s WHERE id = (SELECT min(id) FROM src WHERE g = %s)",
                        (a, b, g),
                    )
                else:
                    db.sql("DELETE FROM src WHERE id = (SELECT max(id) FROM src WHERE g = %s)", (g,))
        for query, sql_text in queries.items():
            fits = all(
                _fits(db, sql_text, column, *shapes[(q, column)]) for q, column in shapes if q == query
            )
            for mode in MODES:
                name = f"{query}_{mode.lower()}"
                before = _contents(db, name)
                if fits:
                    refresh_and_check(db, name)
                else:
                    try:
                        outcomes = refresh(db, name)
                    except ValueNotCarriedError as err:
                        assert err.sqlstate == "22003"
                    else:
                        pytest.fail(
                            f"{name} refreshed ({outcomes}) though a quotient does not fit its Spark type"
                        )
                    assert _contents(db, name) == before


@pytest.mark.parametrize("mode", MODES)
def test_stored_avg_over_unconstrained_numeric_is_exact_or_refused(db: Database, mode: str) -> None:
    """AVG over an unconstrained numeric: the values reach Spark as decimal(38,18), so neither a
    FULL refresh nor a stored aggregate's hidden sum knows their display scale. An average that
    ends within 16 digits is the same at every scale (exact); one that does not is refused."""
    db.sql("CREATE TABLE u (id int PRIMARY KEY, g int NOT NULL, x numeric)")
    db.sql("INSERT INTO u VALUES (1, 0, 1), (2, 0, 0.5), (3, 1, 0.25), (4, 1, 2)")
    create_st(db, "st", "SELECT g, avg(x) AS av, count(*) AS n FROM u GROUP BY g", refresh_mode=mode)
    refresh_and_check(db, "st")
    db.sql("INSERT INTO u VALUES (5, 0, 2.5), (6, 1, 0.75)")  # 4/3 -> no; 4/4 and 3/3: terminate
    db.sql("DELETE FROM u WHERE id = 1")
    _check(db, mode, ["st"])
    # (0.5 + 2.5 + 2) / 3 = 1.6666666666666667 at display scale 1 but 1.666666666666666667 at 18
    db.sql("INSERT INTO u VALUES (7, 0, 2)")
    _assert_refused(db, "st", "AVG(x)", "display scale")
    db.sql("UPDATE u SET x = 1 WHERE id = 7")  # 4 / 3 ... still repeating: still refused
    _assert_refused(db, "st", "AVG(x)")
    db.sql("UPDATE u SET x = 3 WHERE id = 7")  # 6 / 3 = 2: exact again
    _check(db, mode, ["st"])
