"""db.columns.column_types: the one pg_attribute type query, against a real PostgreSQL."""

from __future__ import annotations

import psycopg
import pytest

from pgtrickle.db.columns import column_types
from tests.conftest import Database

pytestmark = pytest.mark.integration


def test_types_in_table_order_without_dropped_columns_by_oid_or_name(db: Database) -> None:
    db.sql(
        "CREATE TABLE public.typed (id bigint, amount numeric(12,2), gone int, note varchar(20), at timestamptz)"
    )
    db.sql("ALTER TABLE public.typed DROP COLUMN gone")
    relid = int(db.scalar("SELECT 'public.typed'::regclass::oid::bigint"))  # type: ignore[call-overload]
    expected = {
        "id": "bigint",
        "amount": "numeric(12,2)",
        "note": "character varying(20)",
        "at": "timestamp with time zone",
    }
    assert column_types(db.conn, relid) == expected
    assert list(column_types(db.conn, relid)) == list(expected)
    assert column_types(db.conn, "public.typed") == expected


def test_a_temporary_view_by_name(db: Database) -> None:
    with db.conn.transaction():
        db.sql("CREATE TEMP VIEW probe AS SELECT 1::int2 AS a, 'x'::text AS b")
        assert column_types(db.conn, "pg_temp.probe") == {"a": "smallint", "b": "text"}


def test_a_missing_relation_name_is_postgresql_s_error(db: Database) -> None:
    with pytest.raises(psycopg.errors.UndefinedTable):
        column_types(db.conn, "public.no_such_table")
