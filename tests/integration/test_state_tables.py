"""Hidden state tables (refresh/state_tables.py) against a real PostgreSQL.

Their types are PostgreSQL's own for the node's query (a domain stored as its base type, a
numeric keeps its modifier), hostile column names survive, a second ensure changes nothing, a
changed query replaces them, the node's query gives the node's value, and they are dropped
with their stream table.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from pgtrickle.catalog.store import StreamTable, load_stream_tables
from pgtrickle.dvm import ir
from pgtrickle.dvm.kept import plan_state_tables
from pgtrickle.dvm.lower import lower
from pgtrickle.dvm.materialize import AGGREGATE_OF_AGGREGATE, decide
from pgtrickle.refresh.state_tables import drop_state_tables, ensure_state_tables
from pgtrickle.sql.translate import parse_query
from tests.conftest import Database
from tests.integration.helpers import create_st

QUERY = (
    'SELECT n AS "order""count", count(*) AS customers FROM ('
    ' SELECT c.id, count(o.id) AS n, sum(o.amount) AS "total.amount"'
    " FROM sh.customers c LEFT JOIN sh.orders o ON o.customer = c.id GROUP BY c.id) per_customer"
    " GROUP BY n"
)


@pytest.fixture
def shop(db: Database) -> Database:
    db.sql("CREATE SCHEMA sh")
    db.sql("CREATE DOMAIN sh.money2 AS numeric(12,2) CHECK (VALUE > -1000000)")
    db.sql("CREATE TABLE sh.customers (id int PRIMARY KEY, name text)")
    db.sql("CREATE TABLE sh.orders (id int PRIMARY KEY, customer int, amount sh.money2)")
    db.sql("INSERT INTO sh.customers SELECT g, 'c' || g FROM generate_series(1, 20) g")
    db.sql("INSERT INTO sh.orders SELECT g, g % 13, (g * 1.25)::numeric(12,2) FROM generate_series(1, 60) g")
    return db


def _stream_table(db: Database, name: str) -> StreamTable:
    return next(st for st in load_stream_tables(db.conn).values() if st.name == name)


def _lowered(st: StreamTable) -> tuple[ir.Node, Mapping[str, tuple[str, str]]]:
    schema = {f"{s.schema}.{s.name}": [n for n, _ in s.column_types] for s in st.sources}
    relations = {f"{s.schema}.{s.name}": (s.schema, s.name) for s in st.sources}
    return lower(parse_query(st.normalized_query), schema), relations


def _plan(db: Database, name: str):  # type: ignore[no-untyped-def]
    st = _stream_table(db, name)
    tree, relations = _lowered(st)
    kept = decide(tree)
    return st, plan_state_tables(st.pgt_id, tree, kept, relations)


def _columns(db: Database, relid: int) -> list[tuple[str, str]]:
    return [
        (str(n), str(t))
        for n, t in db.sql(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (relid,),
        )
    ]


def test_state_tables_are_made_once_with_postgres_types_and_dropped_with_their_stream_table(
    shop: Database,
) -> None:
    db = shop
    create_st(db, '"per count"', QUERY, refresh_mode="FULL")
    st, tables = _plan(db, "per count")
    assert [t.reason for t in tables] == [AGGREGATE_OF_AGGREGATE]
    with db.conn.transaction():
        created = ensure_state_tables(db.conn, st.pgt_id, tables)
    assert created == tables
    relid, reason = db.sql(
        "SELECT relid, reason FROM pgtrickle.pgt_state_tables WHERE pgt_id = %s", (st.pgt_id,)
    )[0]
    assert reason == AGGREGATE_OF_AGGREGATE
    columns = _columns(db, relid)
    # the node's columns (named by the lowering), the domain stored as numeric(12,2), then the row id
    assert columns[-1] == ("__pgt_row_id", "bigint")
    types = dict(columns)
    assert "numeric" in types.values() or any(t.startswith("numeric") for t in types.values())
    assert not any("money2" in t for t in types.values())
    assert db.scalar("SELECT has_table_privilege('public', %s, 'SELECT')", (relid,)) is False

    # the node's own query gives its value: fill the table from it and compare with PostgreSQL
    table = tables[0]
    cols = ", ".join(f'"{c}"' for c in table.columns)
    db.sql(
        f"INSERT INTO {table.qualified} SELECT {cols}, 0 FROM ({table.query}) s"
        " CROSS JOIN LATERAL generate_series(1, s.__pgt_w)"
    )
    expected = db.sql(
        "SELECT c.id, count(o.id), sum(o.amount) FROM sh.customers c LEFT JOIN sh.orders o"
        " ON o.customer = c.id GROUP BY c.id ORDER BY 1"
    )
    got = db.sql(f"SELECT {cols} FROM {table.qualified} ORDER BY 1")
    assert [tuple(r) for r in got] == [tuple(r) for r in expected]

    # a second ensure keeps them
    with db.conn.transaction():
        assert ensure_state_tables(db.conn, st.pgt_id, tables) == []
    assert db.scalar("SELECT relid FROM pgtrickle.pgt_state_tables WHERE pgt_id = %s", (st.pgt_id,)) == relid

    db.sql("SELECT pgtrickle.drop_stream_table(%s)", ('"per count"',))
    assert db.scalar("SELECT count(*) FROM pgtrickle.pgt_state_tables") == 0
    assert db.scalar("SELECT count(*) FROM pg_class WHERE oid = %s", (relid,)) == 0


def test_a_changed_query_replaces_them_and_none_kept_drops_them(shop: Database) -> None:
    db = shop
    create_st(db, '"per count"', QUERY, refresh_mode="FULL")
    st, tables = _plan(db, "per count")
    with db.conn.transaction():
        ensure_state_tables(db.conn, st.pgt_id, tables)
    old = db.scalar("SELECT relid FROM pgtrickle.pgt_state_tables")
    # a source retyped underneath (the query PostgreSQL stores changes with it) gives new nodes
    _tree, relations = _lowered(st)
    changed_tree = lower(
        parse_query(st.normalized_query.replace("count(o.id)", "count(o.amount)")),
        {f"{s.schema}.{s.name}": [n for n, _ in s.column_types] for s in st.sources},
    )
    changed = plan_state_tables(st.pgt_id, changed_tree, decide(changed_tree), relations)
    assert changed[0].name != tables[0].name
    with db.conn.transaction():
        assert ensure_state_tables(db.conn, st.pgt_id, changed) == changed
    new = db.scalar("SELECT relid FROM pgtrickle.pgt_state_tables")
    assert new != old and db.scalar("SELECT count(*) FROM pg_class WHERE oid = %s", (old,)) == 0
    with db.conn.transaction():
        assert drop_state_tables(db.conn, st.pgt_id) == 1
    assert db.scalar("SELECT count(*) FROM pg_class WHERE oid = %s", (new,)) == 0


def test_a_query_with_no_kept_node_has_no_state_table(shop: Database) -> None:
    db = shop
    create_st(
        db,
        "plain",
        "SELECT c.id, count(o.id) AS n FROM sh.customers c JOIN sh.orders o"
        " ON o.customer = c.id GROUP BY c.id",
        refresh_mode="FULL",
    )
    st, tables = _plan(db, "plain")
    assert tables == []
    with db.conn.transaction():
        assert ensure_state_tables(db.conn, st.pgt_id, tables) == []
    assert db.scalar("SELECT count(*) FROM pgtrickle.pgt_state_tables") == 0
