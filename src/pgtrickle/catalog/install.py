"""Install or upgrade pgtrickle's objects in a database, idempotently.

Tables change only through numbered migrations (``sql/migrations/NNN_*.sql``),
each applied once and recorded in ``pgtrickle.pgt_schema_version``. A
migration not recorded yet is applied even when a higher one is (numbers are
reserved by work in parallel branches, so one may arrive after a later one). Functions
and views (the SQL API: ``sql/identity.sql``, ``sql/capture_hierarchy.sql`` and the area
files of ``sql/api/``, in the order ``SQL_API_FILES`` declares) are re-created on every
install, so an upgrade replaces them. Everything runs in one transaction under an advisory lock, so
two concurrent installs cannot interleave and a failed one changes nothing.

Install also repairs change capture: a change buffer table or view, capture
trigger function or trigger dropped by hand (or a capture trigger disabled)
is recreated for every source still in use, and the stream tables reading it
are marked for reinitialization, since changes may have been lost
(``pgtrickle._repair_capture``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable

import psycopg

from pgtrickle.errors import CatalogError

INSTALL_LOCK_KEY = 0x70677472  # "pgtr"
_MIGRATION_NAME = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


@dataclass(frozen=True)
class RepairedCapture:
    source: str
    """The source's display name (a table, or a stream table whose own change buffer was repaired)."""
    problems: list[str]
    """What was missing, now recreated."""
    reinitialized: list[str]
    """The stream tables reading it, marked for reinitialization (next refresh FULL)."""


@dataclass(frozen=True)
class InstallResult:
    applied: list[str]
    current_version: int
    event_triggers: bool
    repaired: list[RepairedCapture] = field(default_factory=list)
    """Change capture that was broken and was repaired by this install."""


# The SQL API, installed in this order after the migrations. PL/pgSQL bodies resolve what they
# call when they run, but SQL-language functions (and BEGIN ATOMIC bodies) and views are checked
# when created, so a file comes after every file whose objects those reference, and a file that
# runs something at install (a DO block) after everything it calls.
SQL_API_FILES: tuple[str, ...] = (
    # Storage types and identity helpers: the API's functions (and what it runs at install) call them.
    "identity.sql",
    # Partition / inheritance capture: the buffer upgrade step rebuilds captures with it.
    "capture_hierarchy.sql",
    "api/00_catalog.sql",
    "api/05_schedules.sql",
    "api/10_capture.sql",
    "api/20_watermarks.sql",
    "api/30_stream_tables.sql",  # stream_tables_info reads the watermark functions
    "api/40_ddl_tracking.sql",
    "api/45_cdc_modes.sql",
    "api/50_circuit_breaker.sql",
    "api/60_refresh_groups.sql",
    "api/70_operations.sql",
    "api/80_served_refresh.sql",  # refresh commands a running daemon serves
    "api/90_entry_points.sql",  # BEGIN ATOMIC bodies call the _api_* functions of every area
    "api/95_buffer_upgrade.sql",  # a DO block: runs at install, after every function exists
)


def sql_dir() -> Traversable:
    """The folder of the shipped SQL (found through the package, so a wheel or an editable install alike)."""
    return resources.files("pgtrickle.catalog") / "sql"


def sql_api() -> list[tuple[str, str]]:
    """The SQL API's files as (name, text), in install order."""
    return [(name, (sql_dir() / name).read_text()) for name in SQL_API_FILES]


def migrations() -> list[Migration]:
    """The migrations shipped with this version, in order."""
    found = []
    for entry in (sql_dir() / "migrations").iterdir():
        match = _MIGRATION_NAME.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions) or (versions and versions[0] != 1):
        raise CatalogError(f"migration files must be numbered uniquely from 001: {versions}")
    return found


def latest_version() -> int:
    return max(m.version for m in migrations())


def applied_versions(conn: psycopg.Connection) -> set[int]:
    """The migrations recorded in the database (empty when not installed)."""
    if installed_version(conn) is None:
        return set()
    return {int(v) for (v,) in conn.execute("SELECT version FROM pgtrickle.pgt_schema_version").fetchall()}


def installed_version(conn: psycopg.Connection) -> int | None:
    """The catalog version in the database, or ``None`` when not installed."""
    row = conn.execute("SELECT to_regclass('pgtrickle.pgt_schema_version') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return None
    row = conn.execute("SELECT coalesce(max(version), 0) FROM pgtrickle.pgt_schema_version").fetchone()
    return int(row[0]) if row else 0


def install(conn: psycopg.Connection, up_to: int | None = None) -> InstallResult:
    """Bring the database's pgtrickle objects to this version (or to ``up_to``, for tests)."""
    applied: list[str] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (INSTALL_LOCK_KEY,))
        conn.execute("SET LOCAL client_min_messages = warning")
        conn.execute("CREATE SCHEMA IF NOT EXISTS pgtrickle")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS pgtrickle.pgt_schema_version ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        current = installed_version(conn) or 0
        done = applied_versions(conn)
        if current > latest_version():
            raise CatalogError(
                f"the database has pgtrickle catalog version {current}, newer than this "
                f"pgtrickle ({latest_version()}); upgrade pgtrickle"
            )
        for migration in migrations():
            if migration.version in done or (up_to is not None and migration.version > up_to):
                continue
            conn.execute(migration.sql)
            conn.execute(
                "INSERT INTO pgtrickle.pgt_schema_version (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
            applied.append(f"{migration.version:03d}_{migration.name}")
        if up_to is not None and up_to < latest_version():
            return InstallResult(
                applied, max(done | {m.version for m in migrations() if m.version <= up_to}), False
            )
        for _name, text in sql_api():
            conn.execute(text)
        event_triggers = _install_event_triggers(conn)
        repaired = repair_capture(conn)
    return InstallResult(applied, latest_version(), event_triggers, repaired)


def repair_capture(conn: psycopg.Connection) -> list[RepairedCapture]:
    """Recreate the missing capture objects of every source still in use (see the module doc)."""
    sources = conn.execute(
        """
        SELECT c.source_relid, pgtrickle._display_name(c.source_schema, c.source_name),
               coalesce((SELECT array_agg(pgtrickle._display_name(s.pgt_schema, s.pgt_name) ORDER BY s.pgt_id)
                           FROM pgtrickle.pgt_dependencies d JOIN pgtrickle.pgt_stream_tables s USING (pgt_id)
                          WHERE d.source_relid = c.source_relid), '{}')
          FROM pgtrickle.pgt_change_sources c
         WHERE c.source_kind = 'STREAM_TABLE'
            OR EXISTS (SELECT 1 FROM pgtrickle.pgt_dependencies d WHERE d.source_relid = c.source_relid)
         ORDER BY 2
        """
    ).fetchall()
    repaired = []
    for relid, name, readers in sources:
        row = conn.execute("SELECT pgtrickle._repair_capture(%s)", (relid,)).fetchone()
        if row and row[0]:
            repaired.append(RepairedCapture(str(name), list(row[0]), list(readers)))
    return repaired


def _install_event_triggers(conn: psycopg.Connection) -> bool:
    """Event triggers need a superuser; without one, DDL tracking is off."""
    row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
    if not row or not row[0]:
        return False
    conn.execute("DROP EVENT TRIGGER IF EXISTS pgtrickle_sql_drop")
    conn.execute(
        "CREATE EVENT TRIGGER pgtrickle_sql_drop ON sql_drop EXECUTE FUNCTION pgtrickle._on_sql_drop()"
    )
    conn.execute("DROP EVENT TRIGGER IF EXISTS pgtrickle_ddl_end")
    conn.execute(
        "CREATE EVENT TRIGGER pgtrickle_ddl_end ON ddl_command_end WHEN TAG IN ('ALTER TABLE', 'CREATE TABLE') "
        "EXECUTE FUNCTION pgtrickle._on_ddl_end()"
    )
    # Renamed stream tables, sources and their schemas: the catalog follows the OIDs.
    conn.execute("DROP EVENT TRIGGER IF EXISTS pgtrickle_rename")
    conn.execute(
        "CREATE EVENT TRIGGER pgtrickle_rename ON ddl_command_end WHEN TAG IN ('ALTER TABLE', 'ALTER SCHEMA') "
        "EXECUTE FUNCTION pgtrickle._on_rename()"
    )
    return True


def require_installed(conn: psycopg.Connection) -> None:
    version = installed_version(conn)
    if version is None:
        raise CatalogError("pgtrickle is not installed in this database; run `pgtrickle install`")
    if version < latest_version() or {m.version for m in migrations()} - applied_versions(conn):
        raise CatalogError(
            f"the pgtrickle catalog is at version {version}, this pgtrickle needs "
            f"{latest_version()}; run `pgtrickle install` to upgrade"
        )
