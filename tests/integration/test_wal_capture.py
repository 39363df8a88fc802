"""WAL capture: the trigger→WAL transition, decoding into buffers, and back."""

from __future__ import annotations

import json
import time

import psycopg
import pytest

from pgtrickle.cdc import pgoutput
from pgtrickle.cdc.wal import SYNC_PREFIX, DecoderThread, WalDecoder, slot_name_for, wait_for_decoder
from pgtrickle.refresh.plan import Action
from pgtrickle.daemon.loop import Scheduler
from pgtrickle.cdc.modes import CaptureManager
from tests.conftest import Database
from tests.integration.helpers import assert_oracle, refresh

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]


@pytest.fixture
def auto_db(db: Database) -> Database:
    db.sql("UPDATE pgtrickle.pgt_settings SET value = 'auto' WHERE name = 'cdc_mode'")
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '20 seconds' WHERE name = 'wal_transition_timeout'")
    db.sql("CREATE TABLE orders (id int PRIMARY KEY, customer text, amount numeric(10,2), note text)")
    db.sql("INSERT INTO orders SELECT g, 'c' || (g % 4), g, repeat('x', 10) FROM generate_series(1, 100) g")
    db.sql(
        "SELECT pgtrickle.create_stream_table('per_customer', 'SELECT customer, count(*) AS n, "
        "sum(amount) AS total FROM orders GROUP BY customer', schedule => '1h')"
    )
    db.sql(
        "SELECT pgtrickle.create_stream_table('big_orders', 'SELECT id, amount, note FROM orders "
        "WHERE amount > 50', schedule => '1h')"
    )
    return db


def source_state(db: Database) -> tuple:
    return db.sql(
        "SELECT cdc_mode, cdc_reason IS NOT NULL FROM pgtrickle.pgt_change_sources "
        "WHERE source_name = 'orders'"
    )[0]


def test_auto_moves_to_wal_after_first_refresh_and_captures_exactly(auto_db: Database) -> None:
    listener = psycopg.connect(auto_db.dsn, autocommit=True)
    listener.execute("LISTEN pg_trickle_cdc_transition")
    scheduler = Scheduler(auto_db.settings, auto_db.dsn)
    try:
        assert source_state(auto_db)[0] == "trigger"
        scheduler.tick()  # initial refresh, then the transition
        assert source_state(auto_db) == ("wal", True)
        assert auto_db.scalar("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'orders'::regclass") == 0
        assert auto_db.scalar("SELECT relreplident FROM pg_class WHERE oid = 'orders'::regclass") == "f"
        assert (
            auto_db.scalar(
                "SELECT count(*) FROM pg_publication_tables WHERE pubname = 'pgtrickle_pub' "
                "AND tablename = 'orders'"
            )
            == 1
        )
        notes = [json.loads(n.payload) for n in listener.notifies(timeout=2, stop_after=1)]
        assert notes and notes[0]["from"] == "trigger" and notes[0]["to"] == "wal"

        auto_db.sql("INSERT INTO orders VALUES (1000, 'new', 99, 'n'), (1001, NULL, NULL, NULL)")
        auto_db.sql("UPDATE orders SET amount = amount + 100, note = repeat('y', 5000) WHERE id <= 5")
        auto_db.sql("UPDATE orders SET id = 2000 WHERE id = 6")
        auto_db.sql("DELETE FROM orders WHERE id BETWEEN 10 AND 12")
        with psycopg.connect(auto_db.dsn) as aborted:
            aborted.execute("DELETE FROM orders")
            aborted.rollback()
        auto_db.sql("UPDATE orders SET customer = 'toast' WHERE id = 1")  # note is TOASTed and unchanged
        wait_for_decoder(auto_db.conn, auto_db.dsn)
        buffer = auto_db.scalar(
            "SELECT buffer_name FROM pgtrickle.pgt_change_sources WHERE source_name = 'orders'"
        )
        actions = auto_db.sql(
            f"SELECT action, count(*) FROM pgtrickle_changes.{buffer} "
            "WHERE xid >= (SELECT pg_snapshot_xmin(min(frontier::text)::pg_snapshot) "
            "FROM pgtrickle.pgt_stream_tables) GROUP BY action ORDER BY action"
        )
        assert dict(actions) == {"D": 3, "I": 2, "U": 7}
        toast_row = auto_db.sql(
            f"SELECT new_customer, length(new_note), length(old_note) "
            f"FROM pgtrickle_changes.{buffer} WHERE new_customer = 'toast'"
        )
        assert toast_row == [("toast", 5000, 5000)]
        outcomes = refresh(auto_db)
        assert [o.action for o in outcomes] == [Action.DIFFERENTIAL, Action.DIFFERENTIAL], outcomes
        assert_oracle(auto_db)
        [outcome] = refresh(auto_db, "per_customer")
        assert outcome.action is Action.NO_DATA

        auto_db.sql("TRUNCATE orders")
        [outcome] = refresh(auto_db, "big_orders")
        assert "truncated" in outcome.reason
        assert_oracle(auto_db, "big_orders")
    finally:
        scheduler.close()
        listener.close()


def test_back_to_triggers_and_dropping_removes_slot_and_publication(auto_db: Database) -> None:
    scheduler = Scheduler(auto_db.settings, auto_db.dsn)
    try:
        scheduler.tick()
        assert source_state(auto_db)[0] == "wal"
        auto_db.sql("INSERT INTO orders VALUES (500, 'w', 1, 'x')")  # captured by WAL
        auto_db.sql("SELECT pgtrickle.set_cdc_mode('orders', 'trigger')")
        scheduler.tick()
        assert source_state(auto_db)[0] == "trigger"
        assert auto_db.scalar("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'orders'::regclass") == 4
        assert auto_db.scalar("SELECT relreplident FROM pg_class WHERE oid = 'orders'::regclass") == "d"
        auto_db.sql("INSERT INTO orders VALUES (501, 'w', 2, 'x')")  # captured by the trigger
        refresh(auto_db)
        assert_oracle(auto_db)
        health = auto_db.sql("SELECT source, cdc_mode, problems FROM pgtrickle.check_cdc_health()")
        assert health == [("public.orders", "trigger", [])]
        scheduler._maintenance(force=True)
        slot = slot_name_for(auto_db.dsn.rsplit("/", 1)[1])
        assert auto_db.scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,)) == 0
        assert auto_db.scalar("SELECT count(*) FROM pg_publication") == 0
    finally:
        scheduler.close()


def test_dropping_the_last_stream_table_leaves_no_slot(auto_db: Database) -> None:
    scheduler = Scheduler(auto_db.settings, auto_db.dsn)
    try:
        scheduler.tick()
        assert source_state(auto_db)[0] == "wal"
    finally:
        scheduler.close()  # stops the decoder: the slot is inactive
    auto_db.sql("SELECT pgtrickle.drop_stream_table('per_customer')")
    assert auto_db.scalar("SELECT count(*) FROM pg_replication_slots") == 1, "big_orders still reads orders"
    auto_db.sql("SELECT pgtrickle.drop_stream_table('big_orders')")
    assert auto_db.scalar("SELECT count(*) FROM pg_replication_slots") == 0
    assert auto_db.scalar("SELECT count(*) FROM pg_publication") == 0
    assert auto_db.scalar("SELECT relreplident FROM pg_class WHERE oid = 'orders'::regclass") == "d"


def test_decoder_restart_neither_loses_nor_duplicates(auto_db: Database) -> None:
    scheduler = Scheduler(auto_db.settings, auto_db.dsn)
    try:
        scheduler.tick()
    finally:
        scheduler.close()
    slot = slot_name_for(auto_db.dsn.rsplit("/", 1)[1])
    buffer = auto_db.scalar(
        "SELECT buffer_name FROM pgtrickle.pgt_change_sources WHERE source_name = 'orders'"
    )
    for i in range(3):
        auto_db.sql(
            "INSERT INTO orders SELECT g, 'r', 1, 'x' FROM generate_series(%s::int, %s::int) g",
            (10_000 + i * 1000, 10_000 + i * 1000 + 499),
        )
        decoder = WalDecoder(auto_db.dsn, slot)
        # stop after the first flush, before confirming to the server: the next run re-reads it all
        original = decoder.flush

        def flush_then_crash() -> None:
            original()
            raise KeyboardInterrupt

        decoder.flush = flush_then_crash  # type: ignore[method-assign]
        with pytest.raises(KeyboardInterrupt):
            decoder.run(timeout=30)
    wait_for_decoder(auto_db.conn, auto_db.dsn)  # no decoder attached: decodes here until caught up
    dupes = auto_db.sql(
        f"SELECT new_id, count(*) FROM pgtrickle_changes.{buffer} WHERE action = 'I' "
        "GROUP BY new_id HAVING count(*) <> 1"
    )
    assert dupes == []
    assert auto_db.scalar(f"SELECT count(*) FROM pgtrickle_changes.{buffer} WHERE action = 'I'") == 1500
    refresh(auto_db)
    assert_oracle(auto_db)


def test_schema_changes_on_a_wal_source_keep_capture_exact(auto_db: Database) -> None:
    scheduler = Scheduler(auto_db.settings, auto_db.dsn)
    try:
        scheduler.tick()
        assert source_state(auto_db)[0] == "wal"
        auto_db.sql("INSERT INTO orders VALUES (700, 'before', 1, 'x')")
        auto_db.sql("ALTER TABLE orders RENAME COLUMN customer TO client")
        auto_db.sql("ALTER TABLE orders ADD COLUMN extra int")
        auto_db.sql("INSERT INTO orders VALUES (701, 'after', 2, 'y', 5)")
        wait_for_decoder(auto_db.conn, auto_db.dsn)
        buffer = auto_db.scalar(
            "SELECT buffer_name FROM pgtrickle.pgt_change_sources WHERE source_name = 'orders'"
        )
        rows = auto_db.sql(
            f"SELECT new_id, new_customer FROM pgtrickle_changes.{buffer} WHERE new_id >= 700 ORDER BY new_id"
        )
        assert rows == [(700, "before"), (701, "after")]
        refresh(auto_db)
        assert_oracle(auto_db)
    finally:
        scheduler.close()


def test_slot_lag_alert_is_sent_once(auto_db: Database) -> None:
    scheduler = Scheduler(auto_db.settings, auto_db.dsn)
    listener = psycopg.connect(auto_db.dsn, autocommit=True)
    listener.execute("LISTEN pg_trickle_alert")
    try:
        scheduler.tick()
        assert source_state(auto_db)[0] == "wal"
        auto_db.sql("UPDATE pgtrickle.pgt_settings SET value = '1' WHERE name = 'slot_lag_alert_bytes'")
        auto_db.sql("INSERT INTO orders SELECT g, 'x', 1, 'y' FROM generate_series(5000, 5100) g")
        scheduler._check_slot_lag()
        scheduler._check_slot_lag()
        alerts = [json.loads(n.payload) for n in listener.notifies(timeout=2)]
        lag = [a for a in alerts if a["event"] == "slot_lag_warning"]
        assert len(lag) == 1
        assert (
            lag[0]["lag_bytes"] > 1
            and lag[0]["threshold_bytes"] == 1
            and lag[0]["slot"].startswith("pgtrickle_")
        )
        health = auto_db.sql("SELECT problems FROM pgtrickle.check_cdc_health()")[0][0]
        assert any("retains" in p for p in health)
    finally:
        listener.close()
        scheduler.close()


def test_wal_capture_keeps_awkward_text_exactly(auto_db: Database) -> None:
    scheduler = Scheduler(auto_db.settings, auto_db.dsn)
    try:
        scheduler.tick()
        assert source_state(auto_db)[0] == "wal"
        awkward = ["tab\there", "new\nline", "back\\slash\\N", "cr\rlf", "\\N", "", "ünïcødé ✓", "a\\tb"]
        for i, text in enumerate(awkward):
            auto_db.sql("INSERT INTO orders VALUES (%s, %s, 1, %s)", (900 + i, text, text))
        auto_db.sql("INSERT INTO orders VALUES (999, NULL, NULL, NULL)")
        wait_for_decoder(auto_db.conn, auto_db.dsn)
        buffer = auto_db.scalar(
            "SELECT buffer_name FROM pgtrickle.pgt_change_sources WHERE source_name = 'orders'"
        )
        rows = auto_db.sql(
            f"SELECT new_id, new_customer, new_note, new_amount FROM pgtrickle_changes.{buffer} "
            "WHERE new_id >= 900 ORDER BY new_id"
        )
        assert rows[:-1] == [(900 + i, t, t, 1) for i, t in enumerate(awkward)]
        assert rows[-1] == (999, None, None, None)
        refresh(auto_db)
        assert_oracle(auto_db)
    finally:
        scheduler.close()


# ------------------------------------------------------------- binary and text decoding

TYPED_COLUMNS = [
    "i2",
    "i4",
    "i8",
    "num",
    "f8",
    "f4",
    "txt",
    "vc",
    "by",
    "bo",
    "d",
    "ts",
    "tstz",
    "iv",
    "u",
    "jb",
    "js",
    "arr",
    "tarr",
    "mood",
    "moods",
    "dom",
    "pair",
    "rng",
]


def typed_source(db: Database, *, extra: str = "") -> str:
    """A WAL source with columns of many types, all captured; returns its buffer name."""
    db.sql("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
    db.sql("CREATE DOMAIN posint AS int CHECK (VALUE > 0)")
    db.sql("CREATE TYPE pair AS (a int, b text)")
    db.sql(
        "CREATE TABLE typed (id int PRIMARY KEY, i2 int2, i4 int4, i8 int8, num numeric, f8 float8, f4 real,"
        " txt text, vc varchar(10), by bytea, bo bool, d date, ts timestamp, tstz timestamptz, iv interval,"
        f" u uuid, jb jsonb, js json, arr int[], tarr text[], mood mood, moods mood[], dom posint, pair pair,"
        f" rng int4range{extra})"
    )
    columns = ", ".join(["id", *TYPED_COLUMNS])
    db.sql(
        "SELECT pgtrickle.create_stream_table('typed_st', %s, schedule => '1h', refresh_mode => 'FULL',"
        " initialize => false)",
        (f"SELECT {columns} FROM typed",),
    )
    db.sql("SELECT pgtrickle.set_cdc_mode('typed', 'wal')")
    threads: list[DecoderThread] = []

    def start_decoder() -> None:  # as the daemon does, for the move; stopped right after
        if not threads:
            threads.append(DecoderThread(db.dsn, slot_name_for(db.dsn.rsplit("/", 1)[1])))
            threads[0].start()

    CaptureManager(db.conn, start_decoder).reconcile()
    for thread in threads:
        thread.stop()
    deadline = time.monotonic() + 30
    while db.scalar("SELECT bool_or(active) FROM pg_replication_slots") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert db.scalar("SELECT cdc_mode FROM pgtrickle.pgt_change_sources WHERE source_name = 'typed'") == "wal"
    return str(db.scalar("SELECT buffer_name FROM pgtrickle.pgt_change_sources WHERE source_name = 'typed'"))


TYPED_ROWS = """
INSERT INTO typed VALUES
 (1, -32768, -2147483648, 9223372036854775807, 'NaN', 'Infinity', '-Infinity', E'tab\\there\\nnew\\\\line ünï ✓',
  'short', '\\x00ff5c0a'::bytea, true, '2024-02-29', '1999-12-31 23:59:59.999999', '2000-01-01 00:00:00+00',
  '1 year 2 mons 3 days 04:05:06.789', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": [1, 2.5, null]}',
  '{"b" :  1 }', '{1,NULL,3}', '{"x y","a\\"b",NULL}', 'happy', '{sad,ok}', 7, '(1,"x, y")', '[1,10)'),
 (2, 0, 0, 0, '123456789012345678901234567890.123456789012345678901234567890', 1.5e300, 3.4e38, '', '',
  '\\x'::bytea, false, '-infinity', 'infinity', '1970-01-01 00:00:00.000001+05:30', '-1 days',
  '00000000-0000-0000-0000-000000000000', '[]', 'null', '{}', '{}', 'sad', '{}', 1, '(,)', 'empty'),
 (3, 1, 2, 3, '-0.000000000000000000001', 'NaN', 'NaN', repeat('\\', 3), 'a\\tb', NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
 (4, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL),
 (5, 5, 5, 5, '5', 5, 5, (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 400) g), 'toast',
  '\\x01', true, '2000-01-01', '2000-01-01', '2000-01-01', '0', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12',
  '{}', '{}', '{5}', '{e}', 'ok', '{happy}', 5, '(5,e)', '(,)')
"""


def differences(db: Database, buffer: str, action: str, prefix: str, expected_table: str) -> list[tuple]:
    """Rows of ``expected_table`` and of the buffer's ``action`` rows that differ (compared as text)."""
    cols = db.scalar("SELECT columns FROM pgtrickle.pgt_change_sources WHERE source_name = 'typed'")
    buf = {c["name"]: c["buf"] for c in cols}  # type: ignore[union-attr]
    src = ", ".join(f"s.{c}::text" for c in TYPED_COLUMNS)
    got = ", ".join(f"b.{prefix}_{buf[c]}::text" for c in TYPED_COLUMNS)
    return db.sql(
        f"SELECT s.id, b.{prefix}_{buf['id']} FROM {expected_table} s"
        f" FULL JOIN (SELECT * FROM pgtrickle_changes.{buffer} WHERE action = %s) b"
        f" ON b.{prefix}_{buf['id']} = s.id WHERE ROW({src}) IS DISTINCT FROM ROW({got})",
        (action,),
    )


def decode(db: Database, binary: bool | None) -> WalDecoder:
    slot = slot_name_for(db.dsn.rsplit("/", 1)[1])
    target = db.scalar("SELECT pg_current_wal_lsn()::text")
    from pgtrickle.cdc.pgoutput import str_to_lsn

    decoder = WalDecoder(db.dsn, slot, binary=binary)
    decoder.run(until_lsn=str_to_lsn(str(target)), timeout=60)
    return decoder


@pytest.mark.parametrize("binary", [None, False], ids=["binary", "text"])
def test_wal_capture_round_trips_many_types_exactly(db: Database, binary: bool | None) -> None:
    buffer = typed_source(db)
    db.sql(TYPED_ROWS)
    decoder = decode(db, binary)
    assert decoder.binary is (binary is None), decoder.text_reason
    assert differences(db, buffer, "I", "new", "typed") == []
    assert db.scalar(f"SELECT count(*) FROM pgtrickle_changes.{buffer} WHERE old_id IS NOT NULL") == 0

    # 12,800 hex digits compress to well over the 2 kB TOAST threshold: stored out of line
    assert db.scalar("SELECT pg_column_size(txt) > 4000 FROM typed WHERE id = 5")
    db.sql("CREATE TABLE typed_before AS SELECT * FROM typed")
    db.sql("UPDATE typed SET i2 = i2 + 1 WHERE id IN (1, 5)")  # txt of row 5 is TOASTed and unchanged
    decoder = decode(db, binary)
    assert decoder.binary is (binary is None)
    assert differences(db, buffer, "U", "new", "(SELECT * FROM typed WHERE id IN (1, 5))") == []
    assert differences(db, buffer, "U", "old", "(SELECT * FROM typed_before WHERE id IN (1, 5))") == []

    db.sql("DROP TABLE typed_before")
    db.sql("CREATE TABLE typed_before AS SELECT * FROM typed")
    db.sql("DELETE FROM typed")
    decode(db, binary)
    assert differences(db, buffer, "D", "old", "typed_before") == []
    assert (
        db.scalar(
            f"SELECT count(*) FROM pgtrickle_changes.{buffer} WHERE action = 'D'"
            " AND num_nonnulls("
            + ", ".join(
                f"new_{c['buf']}"
                for c in db.scalar(
                    "SELECT columns FROM pgtrickle.pgt_change_sources WHERE source_name = 'typed'"
                )
            )
            + ") > 0"
        )
        == 0
    )  # type: ignore[union-attr]


def test_a_type_without_binary_io_decodes_in_text_mode(db: Database) -> None:
    buffer = typed_source(db, extra=", acl aclitem")  # aclitem has no binary send/receive
    db.sql(TYPED_ROWS)
    decoder = decode(db, None)
    assert not decoder.binary and "binary send/receive" in str(decoder.text_reason)
    assert differences(db, buffer, "I", "new", "typed") == []


def test_binary_stream_restarts_in_text_mode_exactly_once(db: Database) -> None:
    buffer = typed_source(db)
    slot = slot_name_for(db.dsn.rsplit("/", 1)[1])
    thread = DecoderThread(db.dsn, slot)
    thread.start()
    try:
        db.sql(
            "INSERT INTO typed (id, i4, txt) SELECT g, g, 'before ' || g FROM generate_series(100, 2099) g"
        )
        wait_for_decoder(db.conn, db.dsn)
        assert thread.decoder.binary
        # A column whose type has no binary I/O: the decoder meets it inside this transaction,
        # drops the transaction's rows, commits what came before and restarts in text mode.
        with psycopg.connect(db.dsn) as writer:
            writer.execute(
                "INSERT INTO typed (id, i4, txt) SELECT g, g, 'mid ' || g FROM generate_series(3000, 3999) g"
            )
            writer.execute("ALTER TABLE typed ADD COLUMN acl aclitem")
            writer.execute(
                "INSERT INTO typed (id, i4, txt, acl) SELECT g, g, 'after', 'postgres=r/postgres'"
                " FROM generate_series(4000, 4999) g"
            )
        db.sql("UPDATE typed SET txt = txt || '!' WHERE id % 2 = 0")
        # The thread's own decoder must decode this (not wait_for_decoder's in-process one, which
        # takes the slot while the thread restarts in text mode and would decode it instead).
        target = pgoutput.str_to_lsn(
            db.scalar("SELECT pg_logical_emit_message(false, %s, '')::text", (SYNC_PREFIX,))
        )
        deadline = time.monotonic() + 120
        while thread.decoder.flushed_lsn < target:
            assert time.monotonic() < deadline, "the decoder thread did not catch up in 120 s"
            time.sleep(0.05)
        assert not thread.decoder.binary and "binary send/receive" in str(thread.decoder.text_reason)
    finally:
        thread.stop()
    dupes = db.sql(
        f"SELECT new_id, action, count(*) FROM pgtrickle_changes.{buffer} GROUP BY 1, 2 HAVING count(*) <> 1"
    )
    assert dupes == []
    counts = dict(db.sql(f"SELECT action, count(*) FROM pgtrickle_changes.{buffer} GROUP BY 1"))
    assert counts == {"I": 4000, "U": 2000}
    cols = db.scalar("SELECT columns FROM pgtrickle.pgt_change_sources WHERE source_name = 'typed'")
    buf = {c["name"]: c["buf"] for c in cols}  # type: ignore[union-attr]
    wrong = db.sql(
        f"SELECT s.id FROM typed s JOIN pgtrickle_changes.{buffer} b ON b.action = 'U'"
        f" AND b.new_{buf['id']} = s.id WHERE (s.i4, s.txt) IS DISTINCT FROM"
        f" (b.new_{buf['i4']}, b.new_{buf['txt']})"
    )
    assert wrong == []


def test_a_restart_waits_for_its_previous_walsender_to_release_the_slot(db: Database) -> None:
    """Restarting in text mode reopens the stream; the slot may still be held a moment."""
    import threading

    import psycopg2
    import psycopg2.extras

    typed_source(db)
    slot = slot_name_for(db.dsn.rsplit("/", 1)[1])
    decoder = WalDecoder(db.dsn, slot)
    holder = psycopg2.connect(db.dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    holder.cursor().start_replication(
        slot_name=slot, decode=False, options={"proto_version": "2", "publication_names": decoder.publication}
    )
    try:
        with pytest.raises(psycopg2.OperationalError) as first:
            decoder._open_stream(restarting=False)  # a first start learns at once that the slot is held
        assert first.value.pgcode == "55006"
        release = threading.Timer(0.5, holder.close)
        release.start()
        started = time.monotonic()
        repl, _ = decoder._open_stream(restarting=True)
        repl.close()
        assert time.monotonic() - started >= 0.4
    finally:
        holder.close()
