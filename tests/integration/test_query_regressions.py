"""Issue 17's regressions: queries accepted at creation must refresh, in the mode the analysis chose.

Each shape once failed at every refresh after the initial FULL (or at the
FULL itself), leaving the stream table stale. Every refresh here is checked
by the oracle (two-way EXCEPT ALL against the defining query in PostgreSQL)
and asserts the mode that ran. Queries that no refresh can run, and
``refresh_mode => 'DIFFERENTIAL'`` on a query without delta rules, are
refused at creation with SQLSTATE 0A000, changing nothing.
"""

from __future__ import annotations

import psycopg
import pytest

from pgtrickle.dvm.lower import lower
from pgtrickle.errors import UnsupportedQueryError
from pgtrickle.refresh.plan import Action
from tests.conftest import Database
from tests.integration.helpers import catalog_fingerprint, create_st, refresh_and_check

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]


@pytest.fixture
def bases(db: Database) -> Database:
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE base_a (i int, j int)")
    db.sql("CREATE TABLE base_b (i int, j int)")
    db.sql("INSERT INTO base_a SELECT g, g * 10 FROM generate_series(1, 20) g")
    db.sql("INSERT INTO base_b SELECT g, g * 100 FROM generate_series(5, 30) g")
    return db


def _actions(outcomes) -> list[Action]:  # type: ignore[no-untyped-def]
    return [o.action for o in outcomes]


NESTED_WITH = {
    "with_in_subquery": "WITH b AS (SELECT * FROM base_b) SELECT v.i, v.j FROM (WITH a AS (SELECT * FROM base_a) "
    "SELECT a.i, a.j FROM a, b WHERE a.i = b.i) v",
    "with_in_cte": "WITH b AS (WITH a AS (SELECT * FROM base_a WHERE j > 30) SELECT a.i, a.j FROM a) "
    "SELECT b.i, b.j, c.j AS k FROM b JOIN base_b c ON c.i = b.i",
    "shadowed_name": "WITH a AS (SELECT i, j FROM base_b) SELECT x.i, a.j FROM (WITH a AS (SELECT i FROM base_a) "
    "SELECT a.i FROM a) x JOIN a ON a.i = x.i",
    "nested_grouped": "SELECT w.i % 3 AS g, count(*) AS n, sum(w.j) AS s FROM (WITH a AS (SELECT * FROM base_a) "
    "SELECT a.i, a.j FROM a) w GROUP BY w.i % 3",
}


@pytest.mark.parametrize("name", sorted(NESTED_WITH))
def test_nested_with_refreshes_differentially(bases: Database, name: str) -> None:
    db = bases
    create_st(db, "st", NESTED_WITH[name])
    assert _actions(refresh_and_check(db, "st")) == [Action.FULL]
    for step in range(2):
        db.sql("INSERT INTO base_a VALUES (%s, %s), (7, 70)", (100 + step, step))
        db.sql("UPDATE base_b SET j = j + 1 WHERE i %% 4 = %s", (step,))
        db.sql("DELETE FROM base_a WHERE i = %s", (3 + step,))
        db.sql("INSERT INTO base_b VALUES (%s, 1)", (100 + step,))
        assert _actions(refresh_and_check(db, "st")) == [Action.DIFFERENTIAL]


@pytest.fixture
def udt(db: Database) -> Database:
    """A base type (as a superuser creates one) whose `=` and opclass live in schema s."""
    for stmt in (
        # tiny tables: keep refreshes differential however many rows change (adaptive fallback off)
        "UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'",
        "CREATE SCHEMA s",
        "CREATE TYPE s.mytype",
        "CREATE FUNCTION s.mytype_in(cstring) RETURNS s.mytype AS 'int4in' LANGUAGE internal STRICT IMMUTABLE",
        "CREATE FUNCTION s.mytype_out(s.mytype) RETURNS cstring AS 'int4out' LANGUAGE internal STRICT IMMUTABLE",
        "CREATE TYPE s.mytype (INPUT = s.mytype_in, OUTPUT = s.mytype_out, LIKE = int4)",
        "CREATE FUNCTION s.mytype_eq(s.mytype, s.mytype) RETURNS bool AS 'int4eq' LANGUAGE internal STRICT IMMUTABLE",
        "CREATE FUNCTION s.mytype_lt(s.mytype, s.mytype) RETURNS bool AS 'int4lt' LANGUAGE internal STRICT IMMUTABLE",
        "CREATE FUNCTION s.mytype_le(s.mytype, s.mytype) RETURNS bool AS 'int4le' LANGUAGE internal STRICT IMMUTABLE",
        "CREATE FUNCTION s.mytype_gt(s.mytype, s.mytype) RETURNS bool AS 'int4gt' LANGUAGE internal STRICT IMMUTABLE",
        "CREATE FUNCTION s.mytype_ge(s.mytype, s.mytype) RETURNS bool AS 'int4ge' LANGUAGE internal STRICT IMMUTABLE",
        "CREATE FUNCTION s.mytype_cmp(s.mytype, s.mytype) RETURNS int AS 'btint4cmp' LANGUAGE internal STRICT "
        "IMMUTABLE",
        "CREATE OPERATOR s.= (LEFTARG = s.mytype, RIGHTARG = s.mytype, PROCEDURE = s.mytype_eq)",
        "CREATE OPERATOR s.< (LEFTARG = s.mytype, RIGHTARG = s.mytype, PROCEDURE = s.mytype_lt)",
        "CREATE OPERATOR s.<= (LEFTARG = s.mytype, RIGHTARG = s.mytype, PROCEDURE = s.mytype_le)",
        "CREATE OPERATOR s.> (LEFTARG = s.mytype, RIGHTARG = s.mytype, PROCEDURE = s.mytype_gt)",
        "CREATE OPERATOR s.>= (LEFTARG = s.mytype, RIGHTARG = s.mytype, PROCEDURE = s.mytype_ge)",
        "CREATE OPERATOR CLASS s.mytype_ops DEFAULT FOR TYPE s.mytype USING btree AS OPERATOR 1 s.<, "
        "OPERATOR 2 s.<=, OPERATOR 3 s.=, OPERATOR 4 s.>=, OPERATOR 5 s.>, FUNCTION 1 s.mytype_cmp(s.mytype, s.mytype)",
        "CREATE TABLE s.t (id int, v s.mytype)",
        "INSERT INTO s.t SELECT g, (g % 7)::text::s.mytype FROM generate_series(1, 40) g",
        "INSERT INTO s.t VALUES (0, NULL), (0, NULL)",
    ):
        db.sql(stmt)
    return db


UDT_QUERIES = {
    "linear": "SELECT id, v FROM s.t WHERE id % 2 = 0",
    "distinct": "SELECT DISTINCT v FROM s.t",
    "grouped": "SELECT v, count(*) AS n, max(id) AS top FROM s.t GROUP BY v",
}


@pytest.mark.parametrize("name", sorted(UDT_QUERIES))
def test_user_defined_type_with_equality_in_its_schema(udt: Database, name: str) -> None:
    db = udt
    create_st(db, "st", UDT_QUERIES[name])
    assert _actions(refresh_and_check(db, "st")) == [Action.FULL]
    for step in range(2):
        db.sql("DELETE FROM s.t WHERE id %% 5 = %s", (step,))
        db.sql("UPDATE s.t SET v = ((id + %s) %% 4)::text::s.mytype WHERE id %% 3 = 0", (step,))
        db.sql("INSERT INTO s.t VALUES (%s, '3'), (%s, NULL)", (200 + step, 300 + step))
        assert _actions(refresh_and_check(db, "st")) == [Action.DIFFERENTIAL]


def test_type_compared_by_code_of_an_ordinary_role_is_refused(udt: Database) -> None:
    """The `=` of the type's opclass is run by the apply: a function an ordinary role owns never is."""
    db = udt
    db.sql("CREATE ROLE eq_owner NOLOGIN")
    db.sql("ALTER FUNCTION s.mytype_eq(s.mytype, s.mytype) OWNER TO eq_owner")
    before = catalog_fingerprint(db)
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as err:
        create_st(db, "st", "SELECT id, v FROM s.t")
    assert "s.mytype_eq" in str(err.value) and "eq_owner" in str(err.value)
    assert catalog_fingerprint(db) == before


REFUSED_IN_EVERY_MODE = {
    "srf_in_from": ("SELECT i FROM base_a, generate_series(1, 10)", "generate_series() in FROM"),
    "srf_in_select": (
        "SELECT i, generate_series(1, i) AS k FROM base_a",
        "set-returning function generate_series()",
    ),
    "srf_in_subquery": (
        "SELECT i FROM base_a WHERE i IN (SELECT generate_series(1, 3))",
        "set-returning function generate_series()",
    ),
    "function_in_from": ("SELECT i, u FROM base_a, upper('x') u", "upper() in FROM"),
    "recursive_cte": (
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) "
        "SELECT i, n FROM base_a, r",
        "WITH RECURSIVE",
    ),
    "nested_recursive_cte": (
        "SELECT v.i FROM (WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r "
        "WHERE n < 3) SELECT i FROM base_a, r) v",
        "WITH RECURSIVE",
    ),
    "sequence": ("SELECT i, nextval('seq'::text) AS k FROM base_a", "nextval()"),
}


@pytest.mark.parametrize("mode", ["AUTO", "FULL", "DIFFERENTIAL"])
@pytest.mark.parametrize("name", sorted(REFUSED_IN_EVERY_MODE))
def test_query_no_refresh_can_run_is_refused_at_creation(bases: Database, name: str, mode: str) -> None:
    db = bases
    db.sql("CREATE SEQUENCE seq")
    query, construct = REFUSED_IN_EVERY_MODE[name]
    before = catalog_fingerprint(db)
    with pytest.raises(psycopg.errors.FeatureNotSupported) as err:
        create_st(db, "st", query, refresh_mode=mode)
    assert construct in str(err.value)
    assert catalog_fingerprint(db) == before
    # The delta engine agrees: it has no rule for the construct either.
    from pgtrickle.sql.translate import parse_query

    with pytest.raises(UnsupportedQueryError):
        lower(parse_query(_normalized(db, query)), {"public.base_a": ["i", "j"], "public.base_b": ["i", "j"]})


def _normalized(db: Database, query: str) -> str:
    """The query as the catalog stores it (pg_get_viewdef with search_path = pg_catalog)."""
    db.sql(f"CREATE VIEW v_probe AS {query}")
    db.sql("SET search_path = pg_catalog")
    try:
        return str(db.sql("SELECT pg_get_viewdef('public.v_probe'::regclass, true)")[0][0])
    finally:
        db.sql("RESET search_path")


NO_DELTA_RULE = {
    "volatile": ("SELECT i, random() AS r FROM base_a", "volatile function random()"),
    "volatile_in_where": ("SELECT i FROM base_a WHERE random() < 2", "volatile function random()"),
    "clock": ("SELECT i FROM base_a WHERE now() > '2000-01-01'", "reads the clock"),
}


@pytest.mark.parametrize("name", sorted(NO_DELTA_RULE))
def test_differential_without_delta_rule_is_refused_at_creation(bases: Database, name: str) -> None:
    db = bases
    query, construct = NO_DELTA_RULE[name]
    before = catalog_fingerprint(db)
    with pytest.raises(psycopg.errors.FeatureNotSupported) as err:
        create_st(db, "st", query, refresh_mode="DIFFERENTIAL")
    assert construct in str(err.value) and "refresh_mode DIFFERENTIAL is not possible" in str(err.value)
    assert err.value.diag.message_hint and "AUTO" in err.value.diag.message_hint
    assert catalog_fingerprint(db) == before
    create_st(db, "st", query)  # AUTO accepts it, and runs it FULL
    with pytest.raises(psycopg.errors.FeatureNotSupported):
        db.sql("SELECT pgtrickle.alter_stream_table('st', refresh_mode => 'DIFFERENTIAL')")
    assert (
        db.sql("SELECT refresh_mode FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'st'")[0][0] == "AUTO"
    )


def test_auto_records_why_it_chose_full(bases: Database) -> None:
    db = bases
    create_st(db, "st", "SELECT i, j FROM base_a WHERE random() < 2")
    assert _actions(refresh_and_check(db, "st")) == [Action.FULL]
    db.sql("INSERT INTO base_a VALUES (500, 5)")
    assert _actions(refresh_and_check(db, "st")) == [Action.FULL]
    mode, reason = db.sql("SELECT effective_mode, reason FROM pgtrickle.explain_refresh_mode('st')")[0]
    assert mode == "FULL" and "volatile function" in reason
    history = db.sql("SELECT action, mode_reason FROM pgtrickle.pgt_refresh_history ORDER BY refresh_id")
    assert history[-1][0] == "FULL" and "volatile function" in history[-1][1]


@pytest.mark.parametrize("mode", ["AUTO", "DIFFERENTIAL"])
def test_differential_plan_spark_refuses_falls_back_to_full_in_auto(
    bases: Database, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delta query that cannot run (as the nested WITH's once could not) never leaves AUTO stale."""
    from pgtrickle.errors import UnsupportedQueryError
    from pgtrickle.refresh.differential import DifferentialRun

    db = bases
    create_st(db, "st", "SELECT a.i, b.j FROM base_a a JOIN base_b b ON a.i = b.i", refresh_mode=mode)
    assert _actions(refresh_and_check(db, "st")) == [Action.FULL]
    calls = []

    def refuse(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        raise UnsupportedQueryError("synthetic: the delta query does not translate")

    monkeypatch.setattr(DifferentialRun, "_compute", refuse)
    db.sql("INSERT INTO base_a VALUES (6, 1), (7, 2)")
    if mode == "DIFFERENTIAL":
        with pytest.raises(UnsupportedQueryError, match="synthetic"):
            refresh_and_check(db, "st")
        return
    assert _actions(refresh_and_check(db, "st")) == [Action.FULL]
    history = db.sql(
        "SELECT action, was_full_fallback, mode_reason FROM pgtrickle.pgt_refresh_history ORDER BY refresh_id"
    )
    assert history[-1][:2] == ("FULL", True) and "differential plan" in history[-1][2]
    mode_now, reason = db.sql("SELECT effective_mode, reason FROM pgtrickle.explain_refresh_mode('st')")[0]
    assert mode_now == "FULL" and "synthetic" in reason
    db.sql("DELETE FROM base_b WHERE i = 6")
    assert _actions(refresh_and_check(db, "st")) == [Action.FULL]
    assert len(calls) == 1  # settled on FULL: no second attempt at the failing plan
