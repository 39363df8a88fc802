"""Bounds on input (docs/BAD_INPUTS.md): the defining query's size and the time its checks take,
and the documented range of every numeric argument of the API and every numeric setting."""

from __future__ import annotations

import time

import psycopg
import pytest

from tests.conftest import Database
from tests.integration.helpers import catalog_fingerprint, create_st

pytestmark = pytest.mark.integration

MB = 1_000_000
# The checks must answer within a couple of seconds; PostgreSQL's own parse of 1 MB is part of it.
BUDGET_SECONDS = 3.0


@pytest.fixture
def shop(db: Database) -> Database:
    db.sql("CREATE TABLE orders (id int PRIMARY KEY, customer text, amount numeric)")
    db.sql("INSERT INTO orders SELECT g, 'c' || (g % 3), g FROM generate_series(1, 10) g")
    return db


def _pad(head: str, unit: str, tail: str = "", size: int = MB) -> str:
    room = size - len(head) - len(tail)
    return head + unit * (room // len(unit)) + tail


# Each one is about 1M characters: accepted (a valid single SELECT) ...
ACCEPTED = {
    "whitespace": _pad("SELECT id, amount FROM orders", " \n\t"),
    "line comments with semicolons": _pad("SELECT id, amount FROM orders\n", "-- ; DROP TABLE orders;\n"),
    "block comments with semicolons": _pad("SELECT id, amount FROM orders ", "/* ; */ "),
    "nested block comments": _pad("SELECT id, amount FROM orders ", "/* /* ; */ */ "),
    "long string literal full of semicolons": _pad("SELECT id, '", "; ", "' AS s FROM orders"),
    "escaped quotes": _pad("SELECT id, '", "'';", "' AS s FROM orders"),
    "E-string with backslashes": _pad("SELECT id, E'", "\\\\;\\';", "' AS s FROM orders"),
    "dollar quote": _pad("SELECT id, $q$", "$;$ ;", "$q$ AS s FROM orders"),
    "quoted identifier": _pad('SELECT id AS "', ';""', '" FROM orders'),
    "semicolons at the end (empty statements)": _pad("SELECT id FROM orders", ";"),
    "nested comments, spaced": _pad("SELECT id, amount FROM orders ", "/* ; /* ; */ ; */\n"),
}
# ... or refused with a clear error (PostgreSQL's limits, or pgtrickle's refusal of shapes its lexer
# takes quadratic time over).
REFUSED = {
    "deeply nested parentheses": (
        "SELECT " + "(" * (MB // 2 - 20) + "1" + ")" * (MB // 2 - 20) + " AS x FROM orders",
        "42601",
    ),
    "deeply nested comments": (_pad("SELECT id FROM orders ", "/*", "*/" * 10), "54000"),
    "operator run": (_pad("SELECT id FROM orders WHERE id = 1 ", "+"), "54000"),
    "a second statement after padding": (_pad("SELECT id FROM orders;", " ", "DROP TABLE orders"), "42601"),
    "a second statement after comments": (
        _pad("SELECT id FROM orders", "/* ; */", ";DROP TABLE orders"),
        "42601",
    ),
    "hex literal": (_pad("SELECT id, 0x", "f", " AS x FROM orders"), "54000"),
}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_a_one_megabyte_query_is_accepted_quickly(shop: Database, name: str) -> None:
    query = ACCEPTED[name]
    start = time.monotonic()
    create_st(shop, "big", query, initialize=False)
    elapsed = time.monotonic() - start
    assert elapsed < BUDGET_SECONDS, f"{name}: {elapsed:.1f}s"
    assert shop.scalar("SELECT defining_query = %s FROM pgtrickle.pgt_stream_tables", (query,))
    assert shop.sql("SELECT * FROM orders") != []  # nothing after the padding ran


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_one_megabyte_query_is_refused_quickly(shop: Database, name: str) -> None:
    query, sqlstate = REFUSED[name]
    before = catalog_fingerprint(shop)
    start = time.monotonic()
    with pytest.raises(psycopg.Error) as info:
        create_st(shop, "big", query, initialize=False)
    elapsed = time.monotonic() - start
    assert elapsed < BUDGET_SECONDS, f"{name}: {elapsed:.1f}s"
    assert info.value.sqlstate == sqlstate, str(info.value)
    assert "stream table public.big" in str(info.value)
    assert catalog_fingerprint(shop) == before


def test_a_second_statement_never_runs(shop: Database) -> None:
    for query in (
        "SELECT id FROM orders; DROP TABLE orders",
        "SELECT id FROM orders; CREATE TABLE zz (a int); INSERT INTO zz VALUES (1)",
        "SELECT id FROM orders /* ; */; DELETE FROM orders",
        "SELECT id FROM orders; SELECT * FROM nowhere",
    ):
        with pytest.raises(psycopg.Error):
            create_st(shop, "two", query, initialize=False)
    assert shop.scalar("SELECT count(*) FROM orders") == 10
    assert shop.scalar("SELECT to_regclass('zz')") is None
    err = _error(shop, "SELECT pgtrickle.create_stream_table('two', 'SELECT 1 AS a FROM orders; SELECT 2')")
    assert err.sqlstate == "42601"
    assert "must be a single SELECT statement" in str(err)


def test_max_query_length_is_a_setting(shop: Database) -> None:
    limit = shop.scalar("SELECT value FROM pgtrickle.pgt_settings WHERE name = 'max_query_length'")
    assert limit == "1048576"
    at_limit = _pad("SELECT id FROM orders", " ", size=1048576)
    create_st(shop, "at_limit", at_limit, initialize=False)
    before = catalog_fingerprint(shop)
    err = _error(shop, "SELECT pgtrickle.create_stream_table('over', %s)", (at_limit + " ",))
    assert err.sqlstate == "54000"
    assert "1048577 bytes, the limit is 1048576 bytes (setting max_query_length)" in str(err)
    assert catalog_fingerprint(shop) == before
    shop.sql("UPDATE pgtrickle.pgt_settings SET value = '2048' WHERE name = 'max_query_length'")
    err = _error(
        shop,
        "SELECT pgtrickle.create_stream_table('over', %s)",
        (_pad("SELECT id FROM orders", " ", size=2049),),
    )
    assert "the limit is 2048 bytes" in str(err)
    create_st(shop, "fits", _pad("SELECT id FROM orders", " ", size=2048), initialize=False)


def _error(db: Database, statement: str, params: object = None) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as info:
        db.sql(statement, params)
    return info.value


# ----------------------------------------------------------------- numeric bounds of the API

ALTER_BOUNDS = [
    # (argument, SQL type, accepted edge values, refused values just past them)
    (
        "circuit_breaker_ceiling",
        "bigint",
        ["1", "1000000000000000"],
        ["0", "1000000000000001", "9223372036854775807"],
    ),
    ("circuit_breaker_max_ratio", "float8", ["1e-9", "1000"], ["0", "1000.0001", "NaN", "Infinity", "-1"]),
    ("circuit_breaker_sensitivity", "float8", ["1e-9", "100"], ["0", "100.0001", "NaN", "Infinity"]),
    ("circuit_breaker_window", "int", ["2", "10000"], ["1", "10001"]),
    ("differential_fallback_ratio", "float8", ["1e-9", "1"], ["0", "1.0001", "NaN", "-Infinity"]),
]


@pytest.mark.parametrize(("arg", "sqltype", "ok", "bad"), ALTER_BOUNDS)
def test_alter_stream_table_bounds(
    shop: Database, arg: str, sqltype: str, ok: list[str], bad: list[str]
) -> None:
    create_st(shop, "st", "SELECT id FROM orders", initialize=False)
    for value in bad:
        before = catalog_fingerprint(shop)
        err = _error(shop, f"SELECT pgtrickle.alter_stream_table('st', {arg} => %s::{sqltype})", (value,))
        assert err.sqlstate == "22023", (arg, value, str(err))
        assert str(err).startswith(arg), str(err)
        assert catalog_fingerprint(shop) == before
    for value in ok:
        shop.sql(f"SELECT pgtrickle.alter_stream_table('st', {arg} => %s::{sqltype})", (value,))


def test_watermark_group_interval_bounds(shop: Database) -> None:
    shop.sql("CREATE TABLE feed_a (id int)")
    shop.sql("CREATE TABLE feed_b (id int)")
    for arg in ("tolerance", "stale_after"):
        for value in ("-1 second", "366 days 1 second", "infinity"):
            err = _error(
                shop,
                f"SELECT pgtrickle.create_watermark_group('g', ARRAY['feed_a', 'feed_b'], {arg} => %s::interval)",
                (value,),
            )
            assert (
                err.sqlstate == "22023"
                and f"{arg} of watermark group 'g' must be between 0 and 366 days" in str(err)
            )
        assert shop.scalar("SELECT count(*) FROM pgtrickle.pgt_watermark_groups") == 0
    shop.sql(
        "SELECT pgtrickle.create_watermark_group('g', ARRAY['feed_a', 'feed_b'], tolerance => '0', stale_after => '366 days')"
    )
    shop.sql("SELECT pgtrickle.alter_watermark_group('g', tolerance => '366 days', stale_after => '0')")
    err = _error(shop, "SELECT pgtrickle.alter_watermark_group('g', tolerance => '367 days')")
    assert err.sqlstate == "22023"


def test_max_rows_bounds(shop: Database) -> None:
    create_st(shop, "st", "SELECT id FROM orders", initialize=False)
    shop.sql("CREATE TABLE feed (id int)")
    for call in (
        "SELECT * FROM pgtrickle.get_refresh_history('st', %s)",
        "SELECT * FROM pgtrickle.watermark_history('feed', %s)",
    ):
        for value in (1, 1_000_000):
            shop.sql(call, (value,))
        for value in (0, 1_000_001, None):
            err = _error(shop, call, (value,))
            assert err.sqlstate == "22023" and "max_rows must be between 1 and 1000000" in str(err)


# --------------------------------------------------------------------- settings bounds

SETTING_BOUNDS = [
    # (setting, accepted edge values, refused values)
    ("max_query_length", ["1024", "104857600"], ["1023", "104857601", "1e9", "10.5", "big"]),
    (
        "slot_lag_alert_bytes",
        ["-1", "1000000000000000"],
        ["-2", "1000000000000001", "9223372036854775807", "1e30"],
    ),
    (
        "circuit_breaker_cold_start_ceiling",
        ["1", "1000000000000000"],
        ["0", "1000000000000001", "9223372036854775807"],
    ),
    ("auto_suspend_after", ["0", "1000"], ["-1", "1001", "2.5", "NaN"]),
    ("stale_data_factor", ["0", "1000", "0.5"], ["-0.1", "1000.1", "NaN", "Infinity"]),
    ("differential_fallback_ratio", ["0.000001", "1000"], ["0", "1000.01", "NaN", "-1"]),
    ("history_retention", ["1 hour", "3650 days"], ["59 minutes", "3651 days", "infinity", "soon"]),
    ("alert_retention", ["1 hour", "3650 days"], ["1 minute", "20 years"]),
    ("watermark_history_retention", ["1 hour", "3650 days"], ["0", "-1 day"]),
    ("wal_transition_timeout", ["1 second", "1 hour"], ["0", "61 minutes"]),
    ("default_schedule", ["1s", "366d", "@daily"], ["0s", "367d", "nope", "0 0 31 2 *"]),
    ("cdc_mode", ["trigger", "WAL", "auto"], ["logical", ""]),
    ("circuit_breaker_default", ["none", "Fixed", "adaptive"], ["off"]),
]


@pytest.mark.parametrize(("name", "ok", "bad"), SETTING_BOUNDS)
def test_settings_bounds(shop: Database, name: str, ok: list[str], bad: list[str]) -> None:
    original = shop.scalar("SELECT value FROM pgtrickle.pgt_settings WHERE name = %s", (name,))
    assert original is not None
    for value in bad:
        err = _error(shop, "UPDATE pgtrickle.pgt_settings SET value = %s WHERE name = %s", (value, name))
        assert err.sqlstate == "22023", (name, value, str(err))
        assert name in str(err)
        assert shop.scalar("SELECT value FROM pgtrickle.pgt_settings WHERE name = %s", (name,)) == original
    for value in ok:
        shop.sql("UPDATE pgtrickle.pgt_settings SET value = %s WHERE name = %s", (value, name))
    # The defaults are in range.
    shop.sql("UPDATE pgtrickle.pgt_settings SET value = %s WHERE name = %s", (original, name))
