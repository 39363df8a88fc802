"""Statement-trigger capture packs INSERTed / DELETEd rows into batches; the buffer view unnests them.

Each test checks the buffer's contents against what the statements did, and
every refresh against the stream table's query (the oracle).
"""

from __future__ import annotations

import pytest

from pgtrickle.cdc.buffers import cleanup_buffers
from tests.integration.helpers import assert_oracle, create_st, refresh

pytestmark = [pytest.mark.integration]


def _buffer(db, table: str) -> str:  # type: ignore[no-untyped-def]
    return str(
        db.scalar(
            "SELECT buffer_name FROM pgtrickle.pgt_change_sources WHERE source_relid = %s::regclass", (table,)
        )
    )


def _column_types(db, relation: str) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    return db.sql(
        "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute"
        " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (relation,),
    )


def test_the_buffer_view_has_exactly_the_rows_tables_column_types(db) -> None:  # type: ignore[no-untyped-def]
    # Spark reads the view: a numeric(10,2) read as plain numeric becomes decimal(38,18)
    # and no longer matches the stream table's rows.
    db.sql(
        "CREATE TABLE t (id int PRIMARY KEY, amount numeric(10,2), code varchar(7), at timestamp(0), c char(3))"
    )
    create_st(db, "st", "SELECT id, amount, code, at, c FROM t", initialize=False)
    buf = _buffer(db, "t")
    types = _column_types(db, f"pgtrickle_changes.{buf}")
    assert types == _column_types(db, f"pgtrickle_changes.{buf}_rows")
    assert ("new_amount", "numeric(10,2)") in types and ("old_code", "character varying(7)") in types


def test_a_bulk_insert_is_packed_4096_to_a_row_and_the_view_gives_every_change(db) -> None:  # type: ignore[no-untyped-def]
    db.sql("CREATE TABLE t (id int PRIMARY KEY, v text, w numeric)")
    create_st(db, "st", "SELECT id, v, w FROM t", initialize=False)
    buf = _buffer(db, "t")
    db.sql("INSERT INTO t SELECT g, 'v' || g, g / 7.0 FROM generate_series(1, 10000) g")
    assert db.sql(f"SELECT action, n_changes FROM pgtrickle_changes.{buf}_batches ORDER BY n_changes") == [
        ("I", 1808),
        ("I", 4096),
        ("I", 4096),
    ]
    assert db.scalar(f"SELECT count(*) FROM pgtrickle_changes.{buf}_rows") == 0
    # The view: one row per change, the inserted values, unique ids, nothing in old_*.
    assert db.sql(
        f"SELECT count(*), count(DISTINCT change_id), count(old_id) + count(old_v) + count(old_w)"
        f" FROM pgtrickle_changes.{buf}"
    ) == [(10000, 10000, 0)]
    assert (
        db.scalar(
            f"SELECT count(*) FROM (SELECT new_id, new_v, new_w FROM pgtrickle_changes.{buf}"
            " EXCEPT ALL SELECT id, v, w FROM t) d"
        )
        == 0
    )
    assert (
        db.scalar(
            f"SELECT count(*) FROM (SELECT id, v, w FROM t EXCEPT ALL"
            f" SELECT new_id, new_v, new_w FROM pgtrickle_changes.{buf}) d"
        )
        == 0
    )


def test_deletes_are_packed_with_their_old_values_and_ids_follow_statement_order(db) -> None:  # type: ignore[no-untyped-def]
    db.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    create_st(db, "st", "SELECT id, v FROM t", initialize=False)
    buf = _buffer(db, "t")
    with db.conn.transaction():
        db.sql("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 5000) g")
        db.sql("UPDATE t SET v = 'u' WHERE id <= 10")
        db.sql("DELETE FROM t WHERE id > 4990")
    rows = db.sql(
        f"SELECT action, min(change_id), max(change_id), count(*), count(new_id), count(old_id)"
        f" FROM pgtrickle_changes.{buf} GROUP BY action ORDER BY min(change_id)"
    )
    assert [(a, n, new, old) for a, _, _, n, new, old in rows] == [
        ("I", 5000, 5000, 0),
        ("U", 10, 10, 10),
        ("D", 10, 0, 10),
    ]
    assert rows[0][2] < rows[1][1] and rows[1][2] < rows[2][1], rows  # statement order
    assert sorted(
        r[0] for r in db.sql(f"SELECT old_id FROM pgtrickle_changes.{buf} WHERE action = 'D'")
    ) == list(range(4991, 5001))
    assert db.scalar(f"SELECT count(DISTINCT xid) FROM pgtrickle_changes.{buf}") == 1


@pytest.mark.spark
def test_packed_changes_refresh_differentially_and_are_cleaned_up(db) -> None:  # type: ignore[no-untyped-def]
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE t (id int PRIMARY KEY, grp int, v numeric)")
    db.sql("INSERT INTO t SELECT g, g % 10, g FROM generate_series(1, 3000) g")
    create_st(db, "agg", "SELECT grp, count(*) AS n, sum(v) AS s FROM t GROUP BY grp")
    create_st(db, "flat", "SELECT id, v FROM t WHERE grp < 5")
    refresh(db)
    assert_oracle(db)
    buf = _buffer(db, "t")
    db.sql("INSERT INTO t SELECT g, g % 10, g FROM generate_series(3001, 9000) g")
    db.sql("DELETE FROM t WHERE id % 3 = 0")
    db.sql("UPDATE t SET v = v + 1 WHERE id % 5 = 0")
    outcomes = refresh(db)
    assert {o.action.value for o in outcomes} == {"DIFFERENTIAL"}, [o.reason for o in outcomes]
    assert_oracle(db)
    assert db.scalar(f"SELECT count(*) FROM pgtrickle_changes.{buf}_batches") > 0
    pending = db.scalar(f"SELECT count(*) FROM pgtrickle_changes.{buf}")
    assert pending == 6000 + 3000 + db.scalar("SELECT count(*) FROM t WHERE id % 5 = 0")
    assert cleanup_buffers(db.conn) >= pending  # (plus the stream tables' own markers)
    assert db.scalar(f"SELECT count(*) FROM pgtrickle_changes.{buf}") == 0


@pytest.mark.spark
def test_hostile_and_long_column_names_are_packed_and_unpacked(db) -> None:  # type: ignore[no-untyped-def]
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    long = "c" * 60
    # Names the capture and the buffer view use for their own columns and aliases.
    db.sql(
        f'CREATE TABLE "Odd ""T""" (id int PRIMARY KEY, xid int, changes text, __ord int, v_id int,'
        f' "we""ird" text, n int, k int, c1 int, b int, e int, p int, {long} int)'
    )
    rows = "SELECT g, g, 'c' || g, g, g, 'w\"' || g, g, g, g, g, g, g, g FROM generate_series({}, {}) g"
    db.sql('INSERT INTO "Odd ""T""" ' + rows.format(1, 50))
    query = (
        f'SELECT id, xid, changes, __ord, v_id, "we""ird", n, k, c1, b, e, p, {long} FROM "Odd ""T"""'
        " WHERE n % 2 = 0"
    )
    create_st(db, "odd", query)
    refresh(db)
    db.sql('INSERT INTO "Odd ""T""" ' + rows.format(51, 5000))
    db.sql('DELETE FROM "Odd ""T""" WHERE id % 7 = 0')
    [outcome] = refresh(db)
    assert outcome.action.value == "DIFFERENTIAL", outcome.reason
    assert_oracle(db)


@pytest.mark.spark
def test_capturing_another_column_and_retyping_one_keep_the_packed_buffer_right(db) -> None:  # type: ignore[no-untyped-def]
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    db.sql("CREATE TABLE t (id int PRIMARY KEY, a int, b text)")
    db.sql("INSERT INTO t SELECT g, g % 10, 'b' || g FROM generate_series(1, 100) g")
    create_st(db, "sa", "SELECT a, count(*) AS n FROM t GROUP BY a")  # captures a and the key id
    refresh(db)
    buf = _buffer(db, "t")
    db.sql("INSERT INTO t SELECT g, g % 10, 'b' || g FROM generate_series(101, 200) g")  # packed without b
    create_st(db, "sb", "SELECT b, count(*) AS n FROM t GROUP BY b")  # b is captured from now on
    db.sql("INSERT INTO t SELECT g, g % 10, 'b' || g FROM generate_series(201, 300) g")
    assert db.sql(f"SELECT count(new_b) FROM pgtrickle_changes.{buf} WHERE new_id BETWEEN 101 AND 300") == [
        (100,)
    ]
    refresh(db)
    assert_oracle(db)
    db.sql("INSERT INTO t SELECT g, g % 10, 'b' || g FROM generate_series(301, 400) g")
    # The key is captured but no defining query reads it, so it may change type; pending
    # packed values of it cannot be kept (they become NULL, as in the rows table) and the
    # stream tables are recomputed.
    db.sql("ALTER TABLE t ALTER COLUMN id TYPE bigint")
    assert _column_types(db, f"pgtrickle_changes.{buf}")[4] == ("new_id", "bigint")
    assert db.sql(f"SELECT count(new_id) FROM pgtrickle_changes.{buf} WHERE new_a IS NOT NULL") == [(0,)]
    db.sql("INSERT INTO t SELECT g, g % 10, 'b' || g FROM generate_series(10000000000, 10000000099) g")
    refresh(db)
    assert_oracle(db)
    assert db.sql(f"SELECT count(new_id) FROM pgtrickle_changes.{buf} WHERE new_id >= 10000000000") == [
        (100,)
    ]
    db.sql("DELETE FROM t WHERE id > 350")
    outcomes = refresh(db)
    assert {o.action.value for o in outcomes} == {"DIFFERENTIAL"}, [o.reason for o in outcomes]
    assert_oracle(db)


def test_dropping_the_last_stream_table_drops_every_part_of_the_buffer(db) -> None:  # type: ignore[no-untyped-def]
    db.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    create_st(db, "st", "SELECT id, v FROM t", initialize=False)
    buf = _buffer(db, "t")
    db.sql("INSERT INTO t VALUES (1, 'x')")
    assert (
        db.scalar(
            "SELECT count(*) FROM pg_class WHERE relnamespace = 'pgtrickle_changes'::regnamespace"
            " AND relname LIKE %s",
            (f"{buf}%",),
        )
        == 4
    )  # view, rows, batches, change id sequence
    db.sql("SELECT pgtrickle.drop_stream_table('st')")
    assert (
        db.sql(
            "SELECT relname FROM pg_class WHERE relnamespace = 'pgtrickle_changes'::regnamespace"
            " AND relname LIKE %s",
            (f"{buf}%",),
        )
        == []
    )
    assert (
        db.scalar(
            "SELECT count(*) FROM pg_type WHERE typnamespace = 'pgtrickle_changes'::regnamespace"
            " AND typname LIKE %s",
            (f"{buf}%",),
        )
        == 0
    )


def test_array_domain_and_odd_types_are_packed_exactly(db) -> None:  # type: ignore[no-untyped-def]
    # Arrays of different lengths cannot be aggregated into one array: they are packed as text.
    # char(4) and bit(3) must not become char(1) / bit(1) on the way (format_type's names).
    db.sql("CREATE DOMAIN positive AS int CHECK (VALUE > 0)")
    db.sql("CREATE TYPE mood AS ENUM ('sad', 'ok')")
    db.sql(
        "CREATE TABLE t (id int PRIMARY KEY, ints int[], words text[], p positive, m mood, j jsonb,"
        " c char(4), bt bit(3), r int4range, f float8, u uuid, b bytea)"
    )
    create_st(db, "st", "SELECT id, ints, words, p, m, j, c, bt, r, f, u, b FROM t", initialize=False)
    buf = _buffer(db, "t")
    db.sql(
        "INSERT INTO t SELECT g, CASE WHEN g % 3 = 0 THEN NULL ELSE array_fill(g, ARRAY[g % 5]) END,"
        " ARRAY['a\tb', 'c\"d', NULL, repeat('x', g % 3)], 1 + g % 4, (ARRAY['sad', 'ok'])[1 + g % 2]::mood,"
        " jsonb_build_object('g', g, 'nested', ARRAY[g, g]), 'ab', B'101', int4range(g, g + 10),"
        " CASE WHEN g = 1 THEN 'Infinity'::float8 ELSE g / 3.0 END, md5(g::text)::uuid, '\\x00ff'::bytea"
        " FROM generate_series(1, 100) g"
    )
    db.sql("DELETE FROM t WHERE id > 90")
    cols = ["id", "ints", "words", "p", "m", "j", "c", "bt", "r", "f", "u", "b"]
    new = ", ".join(f"new_{c}" for c in cols)
    old = ", ".join(f"old_{c}" for c in cols)
    inserted = f"SELECT {new} FROM pgtrickle_changes.{buf} WHERE action = 'I'"
    deleted = f"SELECT {old} FROM pgtrickle_changes.{buf} WHERE action = 'D'"
    source = f"SELECT {', '.join(cols)} FROM t"
    # Inserted = what is left plus what was deleted; deleted = rows 91..100 as they were.
    assert (
        db.scalar(f"SELECT count(*) FROM (({inserted}) EXCEPT ALL (({source}) UNION ALL ({deleted}))) d") == 0
    )
    assert (
        db.scalar(f"SELECT count(*) FROM ((({source}) UNION ALL ({deleted})) EXCEPT ALL ({inserted})) d") == 0
    )
    assert db.scalar(f"SELECT count(*) FROM ({deleted}) d") == 10
    assert db.scalar(f"SELECT count(*) FROM pgtrickle_changes.{buf}_rows") == 0  # all packed
