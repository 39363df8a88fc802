"""A capture object dropped by hand: the tools keep working for the other stream tables,
the broken one is named, its refresh fails saying to run `pgtrickle install`, and the
install repairs it (next refresh FULL and exact, later ones DIFFERENTIAL and exact)."""

from __future__ import annotations

import psycopg
import pytest
from typer.testing import CliRunner

from pgtrickle.cli.main import app
from pgtrickle.errors import CaptureBrokenError
from pgtrickle.ops.metrics import Metrics
from pgtrickle.refresh.plan import Action
from pgtrickle.daemon.loop import Scheduler
from tests.conftest import Database
from tests.integration.helpers import assert_oracle, create_st, refresh, refresh_and_check

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark")]

runner = CliRunner(env={"COLUMNS": "250"})

DROPS = {
    "rows": ("DROP TABLE pgtrickle_changes.changes_{r}_rows CASCADE", "changes_{r}_rows is missing"),
    "batches": ("DROP TABLE pgtrickle_changes.changes_{r}_batches CASCADE", "changes_{r}_batches is missing"),
    "view": ("DROP VIEW pgtrickle_changes.changes_{r}", "view pgtrickle_changes.changes_{r} is missing"),
    "function": ("DROP FUNCTION pgtrickle_changes.capture_{r}() CASCADE", "capture_{r}() is missing"),
    "trigger": ("DROP TRIGGER pgt_capture_upd ON t", "pgt_capture_upd"),
    # (With DDL tracking on, the ALTER TABLE itself would regenerate the capture: as without a superuser.)
    "disabled": (
        "ALTER EVENT TRIGGER pgtrickle_ddl_end DISABLE; ALTER TABLE t DISABLE TRIGGER pgt_capture_ins",
        "pgt_capture_ins on public.t disabled",
    ),
}


def invoke(db: Database, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["--dsn", db.dsn, *args], catch_exceptions=False)


def _try(db: Database, statement: str) -> None:
    """A write to the broken source: refused while its buffer tables are missing, lost otherwise."""
    try:
        db.sql(statement)
    except psycopg.Error:
        pass


@pytest.fixture
def two_sources(db: Database) -> Database:
    db.sql("CREATE TABLE t (id int PRIMARY KEY, k text, v int)")
    db.sql("INSERT INTO t SELECT g, 'k' || (g % 4), g FROM generate_series(1, 40) g")
    db.sql("CREATE TABLE u (id int PRIMARY KEY, v int)")
    db.sql("INSERT INTO u SELECT g, g FROM generate_series(1, 10) g")
    create_st(db, "on_t", "SELECT k, sum(v) AS total, count(*) AS n FROM t GROUP BY k", schedule="1h")
    create_st(db, "on_u", "SELECT id, v * 2 AS w FROM u", schedule="1h")
    refresh_and_check(db)
    return db


def _relid(db: Database, table: str) -> int:
    return int(db.scalar("SELECT %s::regclass::oid::bigint", (table,)))  # type: ignore[arg-type]


def _reinit(db: Database, name: str) -> bool:
    return bool(
        db.scalar("SELECT needs_reinit FROM pgtrickle.pgt_stream_tables WHERE pgt_name = %s", (name,))
    )


@pytest.mark.parametrize("broken", list(DROPS))
def test_a_broken_capture_is_isolated_named_and_repaired(two_sources: Database, broken: str) -> None:
    db = two_sources
    relid = _relid(db, "t")
    drop, problem = DROPS[broken]
    db.sql(drop.format(r=relid))
    problem = problem.format(r=relid)
    _try(db, "UPDATE t SET v = v + 100 WHERE id <= 5")
    _try(db, "INSERT INTO t VALUES (41, 'k9', 41)")
    db.sql("INSERT INTO u VALUES (11, 11)")

    health = dict(db.sql("SELECT source, problems FROM pgtrickle.check_cdc_health()"))
    assert health["public.u"] == []
    assert any(problem in p for p in health["public.t"]), health

    result = invoke(db, "status")
    assert result.exit_code == 2, result.output
    assert "public.on_u" in result.output and "public.on_t" in result.output
    assert problem in result.output and "pgtrickle install" in result.output

    metrics = Metrics()
    metrics.update_from_catalog(db.conn)
    text = metrics.render().decode()
    assert 'pgtrickle_change_capture_broken{source="public.t"} 1.0' in text
    assert 'pgtrickle_change_capture_broken{source="public.u"} 0.0' in text

    result = invoke(db, "refresh", "--all")
    assert result.exit_code == 1, result.output
    assert "FAILED" in result.output and "pgtrickle install" in result.output
    assert "1 failed" in result.output
    assert _reinit(db, "on_t"), "changes may have been lost: the next refresh must recompute"
    assert_oracle(db, "on_u")
    with pytest.raises(CaptureBrokenError, match="pgtrickle install"):
        refresh(db, "on_t")

    result = invoke(db, "verify")
    assert result.exit_code == 1, result.output
    assert "✓ public.on_u" in result.output
    assert "✗ public.on_t" in result.output and problem in result.output

    result = invoke(db, "install")
    assert result.exit_code == 0, result.output
    assert "repaired" in result.output and "public.t" in result.output
    assert dict(db.sql("SELECT source, problems FROM pgtrickle.check_cdc_health()")) == {
        "public.t": [],
        "public.u": [],
    }
    assert invoke(db, "install").output.count("repaired") == 0, "a second install has nothing to repair"

    db.sql("UPDATE t SET v = v + 1 WHERE id BETWEEN 6 AND 8")
    [outcome] = refresh(db, "on_t")
    assert outcome.action is Action.FULL and "repaired" in outcome.reason, outcome.reason
    assert_oracle(db)
    db.sql("UPDATE t SET v = v + 1 WHERE id BETWEEN 9 AND 12")
    db.sql("DELETE FROM t WHERE id = 13")
    db.sql("INSERT INTO t VALUES (50, 'k1', 50)")
    [outcome] = refresh(db, "on_t")
    assert outcome.action is Action.DIFFERENTIAL, outcome.reason
    assert_oracle(db)
    assert invoke(db, "status").exit_code == 0


def test_a_stream_tables_own_buffer_dropped(db: Database) -> None:
    """The buffer an upstream stream table writes its changes to, for the one reading it."""
    db.sql("CREATE TABLE t (id int PRIMARY KEY, k text)")
    db.sql("INSERT INTO t SELECT g, 'k' || (g % 3) FROM generate_series(1, 30) g")
    create_st(db, "a", "SELECT id, k FROM t", schedule="1h")
    create_st(db, "b", "SELECT k, count(*) AS n FROM a GROUP BY k", schedule="1h")
    refresh_and_check(db)
    db.sql(f"DROP TABLE pgtrickle_changes.changes_{_relid(db, 'a')}_rows CASCADE")
    db.sql("INSERT INTO t VALUES (31, 'k1')")
    result = invoke(db, "refresh", "--all")
    assert result.exit_code == 1 and "pgtrickle install" in result.output, result.output
    assert "upstream" in result.output  # b is skipped: a failed
    assert _reinit(db, "b")
    result = invoke(db, "install")
    assert result.exit_code == 0 and "public.a" in result.output, result.output
    outcomes = {o.st.name: o for o in refresh_and_check(db)}
    assert outcomes["a"].action is Action.DIFFERENTIAL and outcomes["b"].action is Action.FULL
    db.sql("INSERT INTO t VALUES (32, 'k2')")
    outcomes = {o.st.name: o for o in refresh_and_check(db)}
    assert outcomes["b"].action is Action.DIFFERENTIAL


def test_the_daemon_keeps_scheduling_the_others(two_sources: Database) -> None:
    db = two_sources
    db.sql(f"DROP TABLE pgtrickle_changes.changes_{_relid(db, 't')}_rows CASCADE")
    db.sql("INSERT INTO u VALUES (11, 11)")
    db.sql("SELECT pgtrickle.refresh_stream_table('on_t'), pgtrickle.refresh_stream_table('on_u')")
    scheduler = Scheduler(db.settings.with_overrides(metrics_port=0), db.dsn)
    try:
        scheduler.start_metrics()
        report = scheduler.tick()  # runs the maintenance (buffer cleanup, metrics) too
        assert [o.st.name for o in report.refreshed] == ["on_u"]
        assert [(st.name, "pgtrickle install" in why) for st, why in report.failed] == [("on_t", True)]
        scheduler._maintenance(force=True)  # noqa: SLF001 - buffer cleanup over a broken buffer
        assert 'pgtrickle_change_capture_broken{source="public.t"} 1.0' in scheduler.metrics.render().decode()
    finally:
        scheduler.close()
    assert_oracle(db, "on_u")
