"""Installing and upgrading the catalog: idempotent, versioned, data-preserving."""

from __future__ import annotations

import psycopg
import pytest

from pgtrickle.catalog.install import install, installed_version, latest_version, require_installed
from pgtrickle.errors import CatalogError

pytestmark = pytest.mark.integration


@pytest.fixture
def empty_db(pg_server):  # type: ignore[no-untyped-def]
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS install_db WITH (FORCE)")
        admin.execute("CREATE DATABASE install_db")
    conn = psycopg.connect(pg_server.dsn_for("install_db"), autocommit=True)
    yield conn
    conn.close()
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS install_db WITH (FORCE)")


def test_fresh_install_then_reinstall_is_a_no_op(empty_db: psycopg.Connection) -> None:
    assert installed_version(empty_db) is None
    with pytest.raises(CatalogError, match="pgtrickle install"):
        require_installed(empty_db)
    first = install(empty_db)
    assert first.current_version == latest_version() and len(first.applied) == latest_version()
    again = install(empty_db)
    assert again.applied == []
    require_installed(empty_db)


def test_upgrade_from_version_1_keeps_stream_tables_and_buffers(empty_db: psycopg.Connection) -> None:
    install(empty_db, up_to=1)
    empty_db.execute((__import__("pgtrickle.catalog.install", fromlist=["x"])._sql_dir()
                      / "api.sql").read_text())  # an API on version-1 tables
    empty_db.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
    empty_db.execute("SELECT pgtrickle.create_stream_table('s', 'SELECT id, v FROM t')")
    empty_db.execute("INSERT INTO t VALUES (1, 1)")
    assert installed_version(empty_db) == 1
    with pytest.raises(CatalogError, match="upgrade"):
        require_installed(empty_db)
    result = install(empty_db)
    assert result.applied[0].startswith("002")
    assert empty_db.execute("SELECT count(*) FROM pgtrickle.pgt_stream_tables").fetchone() == (1,)
    buffer = empty_db.execute("SELECT buffer_name FROM pgtrickle.pgt_change_sources "
                              "WHERE source_name = 't'").fetchone()[0]  # type: ignore[index]
    rows = empty_db.execute(f"SELECT new_id, captured_at IS NOT NULL FROM pgtrickle_changes.{buffer}").fetchall()
    assert rows == [(1, True)]


def test_newer_catalog_than_this_pgtrickle_is_refused(empty_db: psycopg.Connection) -> None:
    install(empty_db)
    empty_db.execute("INSERT INTO pgtrickle.pgt_schema_version (version, name) VALUES (999, 'future')")
    with pytest.raises(CatalogError, match="newer than this"):
        install(empty_db)
