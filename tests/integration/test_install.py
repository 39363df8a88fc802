"""Installing and upgrading the catalog: idempotent, versioned, data-preserving."""

from __future__ import annotations

import psycopg
import pytest

from pgtrickle.catalog.install import (
    install,
    installed_version,
    latest_version,
    migrations,
    require_installed,
)
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
    assert first.current_version == latest_version() and len(first.applied) == len(migrations())
    again = install(empty_db)
    assert again.applied == []
    require_installed(empty_db)


def test_upgrade_from_version_1_keeps_catalog_rows_and_buffers(empty_db: psycopg.Connection) -> None:
    install(empty_db, up_to=1)
    assert installed_version(empty_db) == 1
    # What version 1 left behind: a captured source with its buffer (no captured_at yet).
    empty_db.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
    relid = empty_db.execute("SELECT 't'::regclass::oid::bigint").fetchone()[0]  # type: ignore[index]
    empty_db.execute(
        f"CREATE TABLE pgtrickle_changes.changes_{relid} (change_id bigint GENERATED ALWAYS "
        'AS IDENTITY, xid xid8 NOT NULL, action "char" NOT NULL, new_id int, old_id int)'
    )
    empty_db.execute(
        f"INSERT INTO pgtrickle_changes.changes_{relid} (xid, action, new_id) "
        "VALUES (pg_current_xact_id(), 'I', 1)"
    )
    empty_db.execute(
        "INSERT INTO pgtrickle.pgt_change_sources (source_relid, source_schema, source_name, "
        "source_kind, buffer_name, columns) VALUES (%s, 'public', 't', 'TABLE', %s, "
        '\'[{"attnum": 1, "name": "id", "type": "integer", "buf": "id"}]\')',
        (relid, f"changes_{relid}"),
    )
    with pytest.raises(CatalogError, match="upgrade"):
        require_installed(empty_db)
    result = install(empty_db)
    assert [a[:3] for a in result.applied] == [f"{m.version:03d}" for m in migrations()[1:]]
    rows = empty_db.execute(
        f"SELECT new_id, captured_at IS NOT NULL FROM pgtrickle_changes.changes_{relid}"
    ).fetchall()
    assert rows == [(1, True)]
    # Since version 11 the buffer is a view over its rows and (for tables) packed batches;
    # the old table became the rows part and the triggers write batches.
    assert empty_db.execute(
        f"SELECT relkind FROM pg_class WHERE oid = 'pgtrickle_changes.changes_{relid}'::regclass"
    ).fetchone() == ("v",)
    empty_db.execute("INSERT INTO t VALUES (2, 20), (3, 30)")
    assert empty_db.execute(
        f"SELECT action, new_id FROM pgtrickle_changes.changes_{relid} ORDER BY change_id"
    ).fetchall() == [("I", 1), ("I", 2), ("I", 3)]
    assert empty_db.execute(
        f"SELECT n_changes FROM pgtrickle_changes.changes_{relid}_batches"
    ).fetchall() == [(2,)]
    assert empty_db.execute(
        "SELECT cdc_mode, cdc_mode_setting FROM pgtrickle.pgt_change_sources"
    ).fetchall() == [("trigger", "default")]
    require_installed(empty_db)


def test_newer_catalog_than_this_pgtrickle_is_refused(empty_db: psycopg.Connection) -> None:
    install(empty_db)
    empty_db.execute("INSERT INTO pgtrickle.pgt_schema_version (version, name) VALUES (999, 'future')")
    with pytest.raises(CatalogError, match="newer than this"):
        install(empty_db)
