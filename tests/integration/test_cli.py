"""The ``pgtrickle`` command against a real database (and a second embedded server)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from pathlib import Path

import psycopg
import pytest
from typer.testing import CliRunner

from pgtrickle.catalog.install import latest_version
from pgtrickle.cli.main import app
from tests.conftest import Database
from tests.integration.helpers import assert_oracle

pytestmark = pytest.mark.integration

runner = CliRunner(env={"COLUMNS": "200"})


def invoke(db: Database, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["--dsn", db.dsn, *args], catch_exceptions=False)


@pytest.fixture
def with_st(db: Database) -> Database:
    db.sql("CREATE TABLE t (id int PRIMARY KEY, k text)")
    db.sql("INSERT INTO t SELECT g, 'k' || (g % 3) FROM generate_series(1, 30) g")
    db.sql("SELECT pgtrickle.create_stream_table('per_k', 'SELECT k, count(*) AS n FROM t GROUP BY k')")
    return db


@pytest.mark.usefixtures("spark")
def test_refresh_status_verify(with_st: Database) -> None:
    result = invoke(with_st, "refresh", "per_k")
    assert result.exit_code == 0, result.output
    assert "per_k" in result.output and "FULL" in result.output
    assert_oracle(with_st)
    result = invoke(with_st, "status")
    assert result.exit_code == 0 and "ACTIVE" in result.output and "per_k" in result.output
    assert "change capture" in result.output and "public.t" in result.output and "ok" in result.output
    result = invoke(with_st, "verify")
    assert result.exit_code == 0 and "✓" in result.output
    with_st.sql("INSERT INTO t VALUES (100, 'new')")
    result = invoke(with_st, "verify", "per_k")
    assert result.exit_code == 1 and "1 rows missing" in result.output
    result = invoke(with_st, "refresh", "--all")
    assert result.exit_code == 0
    assert invoke(with_st, "verify").exit_code == 0
    with_st.sql("INSERT INTO t VALUES (101, 'new')")
    result = invoke(with_st, "refresh", "--json", "per_k")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["summary"] == {"total": 1, "refreshed": 1, "failed": 0, "skipped": 0, "exit_code": 0}
    [outcome] = doc["stream_tables"]
    assert outcome["name"] == "public.per_k" and outcome["result"] == "REFRESHED"
    assert outcome["action"] == "DIFFERENTIAL" and outcome["rows_inserted"] >= 1 and outcome["error"] is None
    assert_oracle(with_st)


def test_cli_errors_are_clean(with_st: Database) -> None:
    result = invoke(with_st, "refresh")
    assert result.exit_code == 1 and "name one or more" in result.output
    result = invoke(with_st, "refresh", "nope")
    assert result.exit_code == 1 and "stream table 'nope' does not exist" in result.output
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["--dsn", "postgresql://u:topsecret@127.0.0.1:1/x", "status"])
    assert result.exit_code == 1
    assert "cannot connect" in result.output and "topsecret" not in result.output


def test_install_is_idempotent_and_reports_version(db: Database) -> None:
    result = invoke(db, "install")
    assert result.exit_code == 0 and f"version {latest_version()}" in result.output
    assert "already current" in result.output


def test_status_on_a_database_without_pgtrickle(pg_server) -> None:  # type: ignore[no-untyped-def]
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS plain_db")
        admin.execute("CREATE DATABASE plain_db")
    result = runner.invoke(app, ["--dsn", pg_server.dsn_for("plain_db"), "status"])
    assert result.exit_code == 1 and "pgtrickle install" in result.output


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_embedded_server_lifecycle() -> None:
    root = Path(tempfile.mkdtemp(prefix="pgtrickle-cli-", dir="/tmp"))
    root.chmod(0o755)
    port = str(_free_port())
    args = ["--data-dir", str(root), "--port", port]
    env = {k: v for k, v in os.environ.items() if k != "PGTRICKLE_DSN"}
    try:
        result = runner.invoke(app, [*args, "db", "status"], env=env)
        assert result.exit_code == 3 and "stopped" in result.output
        result = runner.invoke(app, [*args, "db", "start"], env=env)
        assert result.exit_code == 0, result.output
        result = runner.invoke(app, [*args, "db", "dsn"], env=env)
        dsn = result.output.strip()
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
            assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
            assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
        assert oct((root / "superuser.password").stat().st_mode & 0o777) == "0o600"
        assert runner.invoke(app, [*args, "db", "start"], env=env).exit_code == 0, "start is idempotent"
        result = runner.invoke(app, [*args, "install"], env=env)
        assert result.exit_code == 0 and f"version {latest_version()}" in result.output
        assert "****" in result.output and dsn.split(":")[2].split("@")[0] not in result.output
        result = runner.invoke(app, [*args, "db", "stop"], env=env)
        assert result.exit_code == 0 and "stopped" in result.output
        result = runner.invoke(app, [*args, "db", "stop"], env=env)
        assert "was not running" in result.output
    finally:
        runner.invoke(app, [*args, "db", "stop", "--immediate"], env=env)
        shutil.rmtree(root, ignore_errors=True)


def test_embedded_port_conflict_is_explained(pg_server) -> None:  # type: ignore[no-untyped-def]
    root = Path(tempfile.mkdtemp(prefix="pgtrickle-cli-", dir="/tmp"))
    root.chmod(0o755)
    try:
        result = runner.invoke(app, ["--data-dir", str(root), "--port", str(pg_server.port), "db", "start"])
        assert result.exit_code == 1
        assert "used by another program" in result.output
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_explain_says_which_mode_and_why(with_st: Database) -> None:
    result = invoke(with_st, "explain", "per_k")
    assert result.exit_code == 0, result.output
    assert "DIFFERENTIAL" in result.output and "Aggregate" in result.output
    assert with_st.sql("SELECT effective_mode FROM pgtrickle.explain_refresh_mode('per_k')") == [
        ("DIFFERENTIAL",)
    ]
    with_st.sql(
        "SELECT pgtrickle.create_stream_table('firsts', 'SELECT k FROM t ORDER BY k LIMIT 3', "
        "refresh_mode => 'DIFFERENTIAL', initialize => false)"
    )
    result = invoke(with_st, "explain", "firsts")
    # ORDER BY ... LIMIT keeps its input in a hidden state table: DIFFERENTIAL, the table named.
    assert result.exit_code == 0 and "→ DIFFERENTIAL" in result.output and "TopK" in result.output
    assert "hidden state tables:" in result.output
    with_st.sql(
        "SELECT pgtrickle.create_stream_table('rolled', 'SELECT k, count(*) AS n FROM t GROUP BY ROLLUP (k)', "
        "initialize => false)"
    )
    result = invoke(with_st, "explain", "rolled")
    assert result.exit_code == 0 and "FULL" in result.output and "ROLLUP" in result.output
    result = invoke(with_st, "explain", "nope")
    assert result.exit_code == 1 and "nope" in result.output


LONG = "customer_lifetime_value_by_region_and_quarter_rollup_v2"


def test_status_is_readable_at_80_columns(with_st: Database) -> None:
    with_st.sql(f"SELECT pgtrickle.create_stream_table('{LONG}', 'SELECT k FROM t', initialize => false)")
    with_st.sql(
        """SELECT pgtrickle.create_stream_table('public."odd[/]name"', 'SELECT k FROM t',"""
        " initialize => false)"
    )
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["--dsn", with_st.dsn, "status"])
    assert result.exit_code == 0, result.output
    assert all(len(line) <= 80 for line in result.output.splitlines()), result.output
    table = result.output.split("change capture")[0]
    assert "…" not in table, result.output
    assert f"public.{LONG}" in "".join(
        line.split("│")[1].strip() for line in table.splitlines() if line.startswith("│")
    ), result.output
    for word in ("stream table", "status", "mode", "staleness", "INITIALIZING", "AUTO"):
        assert word in table, result.output
    assert 'public."odd[/]name"' in table, "markup in a name is shown as typed"
    wide = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["--dsn", with_st.dsn, "status", "--wide"])
    assert wide.exit_code == 0, wide.output
    header = next(line for line in wide.output.splitlines() if "┃ stream table" in line)
    assert "queued" in header and "watermark gating" in header and "last error" in header
    assert any(f"public.{LONG} " in line for line in wide.output.splitlines()), "no name folds with --wide"


def test_status_and_explain_json(with_st: Database) -> None:
    result = invoke(with_st, "status", "--json")
    assert result.exit_code == 0 and result.stderr == "", result.output
    doc = json.loads(result.stdout)
    assert doc["capture_intact"] is True and doc["broken_capture"] == []
    [st] = doc["stream_tables"]
    assert st["name"] == "public.per_k" and st["schema"] == "public" and st["table"] == "per_k"
    assert st["refresh_mode"] == "AUTO" and st["consecutive_errors"] == 0 and st["last_error"] is None
    assert st["watermark"]["gate_closed"] is False
    assert [c["source"] for c in doc["change_capture"]] == ["public.t"]
    assert doc["change_capture"][0]["problems"] == []

    result = invoke(with_st, "explain", "--json", "per_k")
    assert result.exit_code == 0, result.output
    reason = with_st.scalar("SELECT mode_reason FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'per_k'")
    doc = json.loads(result.stdout)
    tree = doc.pop("operator_tree")
    assert doc == {
        "schema_version": 1,
        "name": "public.per_k",
        "refresh_mode": "AUTO",
        "effective_mode": "DIFFERENTIAL",
        "reason": reason,
        "recorded": True,
    }
    assert tree["error"] is None and tree["root"]["facts"] == "Project k = k_1, n = count"
    assert tree["root"]["inputs"][0]["operator"] == "Aggregate"
    result = invoke(with_st, "explain", "--json", "nope")
    assert result.exit_code == 1 and result.stdout == "" and "nope" in result.stderr

    with_st.sql("DROP TRIGGER pgt_capture_upd ON t")
    result = invoke(with_st, "status", "--json")
    assert result.exit_code == 2, result.output
    doc = json.loads(result.stdout)
    assert doc["capture_intact"] is False and doc["stream_tables"][0]["capture_broken"] is True
    assert doc["stream_tables"][0]["broken_sources"] == ["public.t"]
    assert any("pgt_capture_upd" in p for p in doc["broken_capture"][0]["problems"])
    assert invoke(with_st, "status", "--json", "--watch").exit_code == 1
