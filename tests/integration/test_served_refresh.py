"""`pgtrickle refresh` with a daemon running: the daemon refreshes, the command line prints the same.

The daemon runs in a thread (a real :class:`~pgtrickle.daemon.serve.Daemon` on the
test's database and SparkSession); "a daemon" that never answers, or dies, is a
plain connection holding the daemon lock, which is all the command line can see.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from typer.testing import CliRunner

from pgtrickle.cli.main import app
from pgtrickle.daemon.loop import LOCK_NAMESPACE
from pgtrickle.daemon.serve import Daemon
from pgtrickle.daemon.serve_client import WaitInterrupted, submit, wait_for
from pgtrickle.daemon.serving import DAEMON_LOCK, TIMEOUT_EXIT_CODE
from tests.conftest import Database
from tests.integration.helpers import assert_oracle, create_st, refresh_and_check

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]

runner = CliRunner(env={"COLUMNS": "250"})
NOTICE = "no pgtrickle daemon is running on this database"


def invoke(db: Database, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["--dsn", db.dsn, *args], catch_exceptions=False)


def _wait(condition, what: str, seconds: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _daemons(db: Database) -> int:
    return int(db.scalar("SELECT count(*) FROM pgtrickle._serving_daemons()"))  # type: ignore[arg-type]


@pytest.fixture
def three(db: Database) -> Database:
    """``bad`` fails while a row of ``src`` is not a number; ``bad_down`` reads ``bad``; ``good`` is apart."""
    db.sql("CREATE TABLE src (id int PRIMARY KEY, s text)")
    db.sql("INSERT INTO src SELECT g, g::text FROM generate_series(1, 20) g")
    db.sql("CREATE TABLE other (id int PRIMARY KEY, v int)")
    db.sql("INSERT INTO other SELECT g, g FROM generate_series(1, 20) g")
    create_st(db, "bad", "SELECT id, s::int AS n FROM src", schedule="1h", refresh_mode="FULL")
    create_st(db, "bad_down", "SELECT count(*) AS c FROM bad", schedule="1h")
    create_st(db, "good", "SELECT v % 3 AS m, count(*) AS c FROM other GROUP BY v % 3", schedule="1h")
    refresh_and_check(db)
    return db


@pytest.fixture
def daemon(three: Database) -> Iterator[Daemon]:
    d = Daemon(three.settings.with_overrides(tick_seconds=30.0), three.dsn)
    thread = threading.Thread(target=d.run, kwargs={"install_signal_handlers": False}, daemon=True)
    thread.start()
    try:
        _wait(lambda: _daemons(three) == 1, "the daemon did not register")
        yield d
    finally:
        d.stop_requested = True
        three.sql("NOTIFY pgtrickle_refresh")
        thread.join(timeout=60)
        d.close()
    assert not thread.is_alive()
    _wait(lambda: _daemons(three) == 0, "the daemon lock outlived the daemon's listener connection", 10.0)


def _same_text(output: str) -> str:
    """The output with durations and the column padding they cause taken out."""
    text = re.sub(r"\d+\.\d\d\b", "S", output)
    return re.sub(r"[ ─━═]+", " ", text)


def _same_json(output: str) -> dict:
    doc = json.loads(output)
    for t in doc["stream_tables"]:
        t["seconds"] = None if t["seconds"] is None else "S"
    return doc


def _assert_same_json(served: str, inline: str) -> None:
    """The same document, key order included (durations aside)."""
    assert json.dumps(_same_json(served)) == json.dumps(_same_json(inline)), (served, inline)


def _both(db: Database, daemon: Daemon, change: str, *args: str) -> tuple:
    """Make ``change``, refresh by the daemon; make it again, refresh inline: (served, inline) results."""
    db.sql(change)
    before = daemon.commands_served
    served = invoke(db, "refresh", *args)
    assert daemon.commands_served == before + 1, served.output
    assert NOTICE not in served.stderr
    db.sql(change)
    inline = invoke(db, "refresh", "--inline", *args)
    assert daemon.commands_served == before + 1, "--inline went to the daemon"
    assert NOTICE not in inline.stderr
    assert served.exit_code == inline.exit_code, (served.output, inline.output)
    return served, inline


def test_served_refresh_prints_what_an_inline_one_prints(three: Database, daemon: Daemon) -> None:
    db = three
    change = "INSERT INTO other SELECT max(id) + 1, max(id) + 1 FROM other"
    served, inline = _both(db, daemon, change, "good")
    assert served.exit_code == 0, served.output
    assert "DIFFERENTIAL" in served.stdout and "1 refreshed, 0 failed, 0 skipped" in served.stdout
    assert _same_text(served.stdout) == _same_text(inline.stdout)
    assert_oracle(db, "good")

    served, inline = _both(db, daemon, change, "good", "--json")
    assert served.exit_code == 0
    _assert_same_json(served.stdout, inline.stdout)
    assert _same_json(served.stdout)["stream_tables"][0]["action"] == "DIFFERENTIAL"
    assert_oracle(db, "good")

    # --all, upstream first.
    served, inline = _both(db, daemon, change, "--all", "--json")
    _assert_same_json(served.stdout, inline.stdout)
    assert_oracle(db)

    # The daemon recorded what it ran as a manual refresh, like the command line does.
    assert (
        db.scalar(
            "SELECT count(*) FROM pgtrickle.pgt_refresh_history h JOIN pgtrickle.pgt_stream_tables s USING (pgt_id)"
            " WHERE s.pgt_name = 'good' AND h.initiated_by = 'MANUAL' AND h.status = 'COMPLETED'"
        )
        == 6
    )
    assert db.scalar("SELECT count(*) FROM pgtrickle.pgt_refresh_commands") == 0  # collected


def test_served_failure_and_refusal_print_what_inline_ones_print(three: Database, daemon: Daemon) -> None:
    db = three
    # A failing refresh: the others go on, its downstream is skipped, exit status 1.
    served, inline = _both(db, daemon, "UPDATE src SET s = 'x' WHERE id = 1", "bad", "bad_down", "good")
    assert served.exit_code == 1
    assert "CAST_INVALID_INPUT" in served.stdout and "1 refreshed, 1 failed, 1 skipped" in served.stdout
    assert _same_text(served.stdout) == _same_text(inline.stdout)
    served, inline = _both(db, daemon, "UPDATE src SET s = 'y' WHERE id = 1", "bad", "--json")
    assert served.exit_code == 1
    doc = _same_json(served.stdout)
    _assert_same_json(served.stdout, inline.stdout)
    assert doc["stream_tables"][0]["error"]["type"] == "RefreshError"

    # A refused command (the circuit breaker is open): the same error, nothing refreshed, exit 1.
    db.sql("UPDATE src SET s = '1' WHERE id = 1")
    db.sql(
        "UPDATE pgtrickle.pgt_stream_tables SET cb_mode = 'fixed', cb_state = 'open', cb_trip_reason = 'test trip'"
        " WHERE pgt_name = 'good'"
    )
    history = db.scalar("SELECT count(*) FROM pgtrickle.pgt_refresh_history")
    served, inline = _both(db, daemon, "SELECT 1", "good")
    assert served.exit_code == 1
    assert "error: the circuit breaker of stream table public.good is open (test trip)" in served.stderr
    assert served.stderr == inline.stderr and served.stdout == inline.stdout == ""
    assert db.scalar("SELECT count(*) FROM pgtrickle.pgt_refresh_history") == history

    # With --all a gated stream table is skipped and reported, the others refresh.
    assert invoke(db, "refresh", "--inline", "bad", "bad_down").exit_code == 0
    served, inline = _both(
        db, daemon, "INSERT INTO other SELECT max(id) + 1, 0 FROM other", "--all", "--json"
    )
    assert served.exit_code == 0
    doc = _same_json(served.stdout)
    _assert_same_json(served.stdout, inline.stdout)
    assert [t["result"] for t in doc["stream_tables"]] == ["REFRESHED", "REFRESHED", "SKIPPED"], doc
    assert_oracle(db, "bad", "bad_down")

    # An unknown name: the same error and hint, before anything is queued.
    served = invoke(db, "refresh", "nope")
    inline = invoke(db, "refresh", "--inline", "nope")
    assert served.exit_code == inline.exit_code == 1
    assert served.stderr == inline.stderr and "nope" in served.stderr
    db.sql(
        "UPDATE pgtrickle.pgt_stream_tables SET cb_mode = 'default', cb_state = 'closed', cb_trip_reason = NULL"
    )
    assert invoke(db, "refresh", "--all").exit_code == 0
    assert_oracle(db)


def test_without_a_daemon_the_command_line_refreshes_and_says_so(three: Database) -> None:
    db = three
    db.sql("INSERT INTO other VALUES (100, 100)")
    result = invoke(db, "refresh", "good", "--json")
    assert result.exit_code == 0, result.output
    assert NOTICE in result.stderr and result.stderr.count("\n") == 1
    assert json.loads(result.stdout)["stream_tables"][0]["result"] == "REFRESHED"  # stdout: the document only
    assert_oracle(db, "good")
    # The SQL function queues and says nobody will run it yet.
    notices: list[str] = []
    db.conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    db.sql("SELECT pgtrickle.refresh_stream_table('good')")
    assert any("no pgtrickle daemon is running" in n for n in notices), notices


def test_a_killed_daemon_is_not_taken_for_a_live_one(three: Database) -> None:
    db = three
    code = (
        "import sys, time, psycopg\n"
        "conn = psycopg.connect(sys.argv[1], autocommit=True)\n"
        f"conn.execute('SELECT pg_advisory_lock_shared({DAEMON_LOCK[0]}, {DAEMON_LOCK[1]})')\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, db.dsn], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert _daemons(db) == 1
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    _wait(lambda: _daemons(db) == 0, "PostgreSQL kept the killed process's lock")
    db.sql("INSERT INTO other VALUES (101, 101)")
    result = invoke(db, "refresh", "good")
    assert result.exit_code == 0, result.output
    assert NOTICE in result.stderr
    assert_oracle(db, "good")


def _fake_daemon(db: Database) -> psycopg.Connection:
    conn = psycopg.connect(db.dsn, autocommit=True)
    conn.execute("SELECT pg_advisory_lock_shared(%s, %s)", DAEMON_LOCK)
    return conn


def test_a_daemon_that_dies_while_refreshing_is_replaced_by_the_command_line(three: Database) -> None:
    db = three
    fake = _fake_daemon(db)

    def claim_then_die() -> None:
        _wait(lambda: db.scalar("SELECT count(*) FROM pgtrickle.pgt_refresh_commands") == 1, "no command")
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE pgtrickle.pgt_refresh_commands SET claimed_by = %s, claimed_at = now()",
                (fake.info.backend_pid,),
            )
        time.sleep(0.3)
        fake.close()

    thread = threading.Thread(target=claim_then_die, daemon=True)
    thread.start()
    db.sql("INSERT INTO other VALUES (102, 102)")
    result = invoke(db, "refresh", "good")
    thread.join(timeout=30)
    assert result.exit_code == 0, result.output
    assert "the pgtrickle daemon stopped before answering: refreshing in this process" in result.stderr
    assert "1 refreshed" in result.stdout
    assert db.scalar("SELECT count(*) FROM pgtrickle.pgt_refresh_commands") == 0
    assert_oracle(db, "good")


def test_timeout_and_interrupt(three: Database) -> None:
    db = three
    fake = _fake_daemon(db)
    try:
        db.sql("INSERT INTO other VALUES (103, 103)")
        # Nobody takes it: withdrawn, nothing refreshed.
        started = time.monotonic()
        result = invoke(db, "refresh", "good", "--timeout", "1")
        assert result.exit_code == TIMEOUT_EXIT_CODE, result.output
        assert time.monotonic() - started < 15
        assert "no pgtrickle daemon started the refresh within 1s" in result.stderr
        assert "nothing was refreshed" in result.stderr and result.stdout == ""
        assert db.scalar("SELECT count(*) FROM pgtrickle.pgt_refresh_commands") == 0

        # Taken and never finished: the daemon is said to go on with it.
        def claim() -> None:
            _wait(lambda: db.scalar("SELECT count(*) FROM pgtrickle.pgt_refresh_commands") == 1, "no command")
            db.sql("UPDATE pgtrickle.pgt_refresh_commands SET claimed_by = %s", (fake.info.backend_pid,))

        thread = threading.Thread(target=claim, daemon=True)
        thread.start()
        result = invoke(db, "refresh", "good", "--timeout", "2")
        thread.join(timeout=30)
        assert result.exit_code == TIMEOUT_EXIT_CODE, result.output
        assert f"the pgtrickle daemon (backend pid {fake.info.backend_pid}) did not finish" in result.stderr

        # Ctrl-C while queued: withdrawn; while being refreshed: left to the daemon.
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            command = submit(conn, ["good"], False)
            ticks = iter([0.0])

            def interrupt() -> float:
                try:
                    return next(ticks)
                except StopIteration:
                    raise KeyboardInterrupt from None

            with pytest.raises(WaitInterrupted) as queued:
                wait_for(db.dsn, conn, command, 60.0, clock=interrupt)
            assert queued.value.withdrawn and "nothing was refreshed" in str(queued.value)

            command = submit(conn, ["good"], False)
            conn.execute(
                "UPDATE pgtrickle.pgt_refresh_commands SET claimed_by = %s", (fake.info.backend_pid,)
            )

            def ctrl_c(pid: int) -> None:
                raise KeyboardInterrupt

        with psycopg.connect(db.dsn, autocommit=True) as conn, pytest.raises(WaitInterrupted) as running:
            wait_for(db.dsn, conn, command, 60.0, on_claimed=ctrl_c)
        assert not running.value.withdrawn and "finishes it" in str(running.value)
        assert db.scalar("SELECT count(*) FROM pgtrickle.pgt_refresh_commands") == 0
    finally:
        fake.close()
    result = invoke(db, "refresh", "good")
    assert result.exit_code == 0 and NOTICE in result.stderr
    assert_oracle(db, "good")


def test_a_command_for_a_stream_table_refreshed_elsewhere_is_left_to_that_process(three: Database) -> None:
    db = three
    good = db.scalar("SELECT pgt_id FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'good'")
    d = Daemon(db.settings, db.dsn)
    other = psycopg.connect(db.dsn, autocommit=True)  # another daemon, refreshing `good` right now
    try:
        d.serving_pid = d.conn.info.backend_pid  # registered (run() does it on its listener)
        other.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_NAMESPACE, good))
        db.sql("INSERT INTO other VALUES (104, 104)")
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            named = submit(conn, ["good"], False)
            every = submit(conn, None, False)
        assert d.serve_commands() == 1  # --all is taken; `good` fails there as locked elsewhere
        rows = dict(db.sql("SELECT command_id, claimed_by FROM pgtrickle.pgt_refresh_commands"))
        assert rows == {named: None, every: d.serving_pid}
        doc = db.scalar("SELECT result FROM pgtrickle.pgt_refresh_commands WHERE command_id = %s", (every,))
        assert [t["result"] for t in doc["stream_tables"]] == ["REFRESHED", "REFRESHED", "FAILED"]
        assert "being refreshed by another process" in doc["stream_tables"][2]["reason"]
        other.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_NAMESPACE, good))
        assert d.serve_commands() == 1  # free now: taken and refreshed
        doc = db.scalar("SELECT result FROM pgtrickle.pgt_refresh_commands WHERE command_id = %s", (named,))
        assert doc["stream_tables"][0]["action"] == "DIFFERENTIAL", doc
        assert_oracle(db, "good")
    finally:
        other.close()
        d.close()
