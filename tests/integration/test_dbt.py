"""The dbt package (integrations/dbt): its example project run by real dbt-core + dbt-postgres.

dbt runs in a subprocess against this test's database: one process for the module
(:class:`DbtProcess`), which imports dbt once and runs each command through dbt's programmatic
entry point (``dbtRunner``, what the ``dbt`` command runs), with the ``dbt`` command's exit codes.
The project is a copy of integrations/dbt/example in a temporary directory (dbt writes target/,
logs/ and dbt_packages/ there), with a profile pointing at the test's PostgreSQL. After each `dbt run`
the stream tables are refreshed through the refresh engine and checked against their defining
queries (two-way EXCEPT ALL).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml

from tests.conftest import Database
from tests.integration.helpers import assert_oracle, catalog_fingerprint, refresh

# Each dbt command parses the project (seconds each on a loaded machine).
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("spark"), pytest.mark.timeout(1800)]

PACKAGE = Path(__file__).resolve().parents[2] / "integrations" / "dbt"
SCHEMA = "dbt Shop"  # every model lands here: a schema name that needs quoting
DRIVER = Path(__file__).with_name("dbt_driver.py")
HOSTILE = "Order \"Totals\" 'EU'"  # an alias with both kinds of quote


class DbtProcess:
    """The dbt process of the module (tests/integration/dbt_driver.py): dbt imported once."""

    def __init__(self) -> None:
        env = {
            **os.environ,
            "DBT_SEND_ANONYMOUS_USAGE_STATS": "false",
            "DBT_VERSION_CHECK": "false",
            "DBT_USE_COLORS": "false",
            "DBT_PRINTER_WIDTH": "200",
        }
        read, write = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, str(DRIVER), str(write)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            env=env,
            pass_fds=(write,),
            text=True,
        )
        os.close(write)
        self.answers = os.fdopen(read)

    def run(self, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"args": args, "cwd": str(cwd)}) + "\n")
        self.proc.stdin.flush()
        line = self.answers.readline()
        assert line, f"the dbt process exited ({self.proc.wait()})"
        answer = json.loads(line)
        return subprocess.CompletedProcess(["dbt", *args], answer["code"], answer["output"], "")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.answers.close()


@pytest.fixture(scope="module")
def dbt_process() -> Iterator[DbtProcess]:
    process = DbtProcess()
    try:
        yield process
    finally:
        process.close()


@dataclass
class Project:
    root: Path
    db: Database
    process: DbtProcess

    def dbt(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.process.run(
            [*args, "--project-dir", str(self.root), "--profiles-dir", str(self.root)], self.root
        )

    def ok(self, *args: str) -> str:
        result = self.dbt(*args)
        assert result.returncode == 0, f"dbt {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
        return result.stdout

    def model(self, name: str) -> Path:
        return self.root / "models" / f"{name}.sql"

    def relid(self, name: str) -> int | None:
        return self.db.scalar(
            "SELECT pgt_relid::bigint FROM pgtrickle.pgt_stream_tables"
            " WHERE pgt_schema = %s AND pgt_name = %s",
            (SCHEMA, name),
        )  # type: ignore[return-value]


def qualified(name: str) -> str:
    """The name as pgtrickle (and the materialization's log) shows it: quoted where needed."""
    quoted = '"{}"'.format(name.replace('"', '""'))
    return '"{}".{}'.format(SCHEMA, name if re.fullmatch(r"[a-z_][a-z0-9_]*", name) else quoted)


@pytest.fixture
def project(db: Database, tmp_path: Path, dbt_process: DbtProcess) -> Iterator[Project]:
    root = tmp_path / "example"
    local = ("target", "logs", "dbt_packages", "package-lock.yml", "profiles.yml")
    shutil.copytree(PACKAGE / "example", root, ignore=shutil.ignore_patterns(*local))
    (root / "packages.yml").write_text(yaml.safe_dump({"packages": [{"local": str(PACKAGE)}]}))
    url = urlsplit(db.dsn)
    output = {
        "type": "postgres",
        "host": url.hostname,
        "port": url.port,
        "user": unquote(url.username or ""),
        "password": unquote(url.password or ""),
        "dbname": url.path.lstrip("/"),
        "schema": SCHEMA,
        "threads": 1,
    }
    profile = {"pgtrickle_example": {"target": "test", "outputs": {"test": output}}}
    (root / "profiles.yml").write_text(yaml.safe_dump(profile))
    project = Project(root, db, dbt_process)
    project.ok("deps")
    project.ok("seed")
    yield project


def test_example_project_create_alter_replace_full_refresh(project: Project) -> None:
    db = project.db
    out = project.ok("run")
    assert f"pgtrickle: created stream table {qualified('customer_totals')}" in out, out
    assert f"pgtrickle: created stream table {qualified('region_totals')}" in out, out
    info = db.sql("SELECT name, schedule, refresh_mode FROM pgtrickle.stream_tables_info ORDER BY pgt_id")
    assert info == [
        (qualified("customer_totals"), "1m", "AUTO"),
        (qualified("region_totals"), "calculated", "AUTO"),
    ]
    # The ref() is an edge of pgtrickle's DAG.
    edge = db.sql(
        "SELECT s.pgt_name, c.source_kind FROM pgtrickle.pgt_dependencies d"
        " JOIN pgtrickle.pgt_stream_tables s USING (pgt_id)"
        " JOIN pgtrickle.pgt_change_sources c USING (source_relid)"
        " WHERE d.source_relid = %s",
        (project.relid("customer_totals"),),
    )
    assert edge == [("region_totals", "STREAM_TABLE")]

    refresh(db)
    assert_oracle(db)
    assert db.scalar(f"SELECT count(*) FROM {qualified('customer_totals')}") == 5
    out = project.ok("test")
    assert re.search(r"PASS=6 WARN=0 ERROR=0 SKIP=0", out), out

    # New source rows: a DIFFERENTIAL refresh, still exact, and dbt test still passes.
    db.sql(f"INSERT INTO {qualified('orders')} VALUES (41, 1, 10.5), (42, 4, 99.99)")
    db.sql(f"UPDATE {qualified('customers')} SET region = 'west' WHERE customer_id = 5")
    refresh(db)
    assert_oracle(db)

    # Only an option changed: altered in place (same table, same OID).
    relid, down = project.relid("customer_totals"), project.relid("region_totals")
    model = project.model("customer_totals")
    model.write_text(model.read_text().replace("schedule='1m'", "schedule='5m'"))
    out = project.ok("run")
    assert f"pgtrickle: altered stream table {qualified('customer_totals')} (schedule: 1m -> 5m)" in out, out
    assert f"pgtrickle: stream table {qualified('region_totals')} is up to date" in out, out
    assert (project.relid("customer_totals"), project.relid("region_totals")) == (relid, down)
    assert (
        db.scalar(
            "SELECT schedule FROM pgtrickle.stream_tables_info WHERE name = %s",
            (qualified("customer_totals"),),
        )
        == "5m"
    )
    # The same SQL written differently is the same query (compared normalized): still no replace.
    model.write_text(model.read_text().replace("count(*) as orders", "COUNT(*)  AS orders /* reformatted */"))
    out = project.ok("run")
    assert "is up to date" in out and "replacing" not in out, out
    assert project.relid("customer_totals") == relid

    # The query changed: replaced, saying so; the stream table built on it goes and comes back.
    model.write_text(
        model.read_text().replace(
            "sum(o.amount) as total", "sum(o.amount) as total,\n       max(o.amount) as largest"
        )
    )
    out = project.ok("run")
    assert (
        f"pgtrickle: replacing stream table {qualified('customer_totals')} (its defining query changed)"
        in out
    ), out
    assert (
        f"dropping the stream tables built on {qualified('customer_totals')} with it: "
        f"{qualified('region_totals')}" in out
    ), out
    assert f"pgtrickle: created stream table {qualified('region_totals')}" in out, out
    new_relid = project.relid("customer_totals")
    assert new_relid not in (None, relid)
    assert (
        db.scalar(
            "SELECT schedule FROM pgtrickle.stream_tables_info WHERE name = %s",
            (qualified("customer_totals"),),
        )
        == "5m"
    )
    refresh(db)
    assert_oracle(db)
    assert db.scalar(f"SELECT count(*) FROM {qualified('customer_totals')} WHERE largest IS NOT NULL") == 5
    project.ok("test")

    # --full-refresh: dropped and created again.
    out = project.ok("run", "--full-refresh", "-s", "region_totals")
    assert f"pgtrickle: replacing stream table {qualified('region_totals')} (full refresh)" in out, out
    assert project.relid("region_totals") not in (None, down)
    assert project.relid("customer_totals") == new_relid
    refresh(db)
    assert_oracle(db)
    project.ok("test")


def test_bad_config_fails_the_run_and_changes_nothing(project: Project) -> None:
    db = project.db
    model = project.model("customer_totals")
    original = model.read_text()

    def run_with(change: tuple[str, str], message: str) -> None:
        model.write_text(original.replace(*change))
        before = catalog_fingerprint(db)
        result = project.dbt("run", "-s", "customer_totals")
        assert result.returncode == 1, result.stdout
        assert message in result.stdout, result.stdout
        assert catalog_fingerprint(db) == before

    # Creating: refused, nothing created.
    run_with(("refresh_mode='AUTO'", "refresh_mode='SOMETIMES'"), "invalid refresh_mode 'SOMETIMES'")
    assert db.scalar("SELECT count(*) FROM pgtrickle.pgt_stream_tables") == 0
    # Altering an existing stream table: refused, nothing altered.
    model.write_text(original)
    project.ok("run", "-s", "customer_totals")
    run_with(("schedule='1m'", "schedule='every tuesday'"), "invalid schedule 'every tuesday'")
    run_with(
        ("schedule='1m'", "schedule='1m', circuit_breaker='sometimes'"), "invalid circuit_breaker 'sometimes'"
    )
    assert db.sql("SELECT schedule FROM pgtrickle.stream_tables_info") == [("1m",)]


def config(alias: str, schedule: str) -> str:
    """A model's config() call with this alias and schedule. The alias is built with Jinja's ~ from
    parts without a single quote: a backslash escape in a string literal reaches dbt unchanged."""
    parts = ' ~ "\'" ~ '.join(f"'{part}'" for part in alias.split("'"))
    return f"{{{{ config(alias={parts}, schedule='{schedule}') }}}}\n"


def test_hostile_alias_and_a_table_model_that_becomes_a_stream_table(project: Project) -> None:
    db = project.db
    hostile = project.model("hostile")
    body = "select customer_id, region from {{ ref('customers') }} where region <> 'south'\n"
    hostile.write_text(config(HOSTILE, "10m") + body)
    out = project.ok("run", "-s", "hostile")
    assert f"pgtrickle: created stream table {qualified(HOSTILE)}" in out, out
    assert db.sql("SELECT schema_name, table_name, schedule FROM pgtrickle.stream_tables_info") == [
        (SCHEMA, HOSTILE, "10m")
    ]
    refresh(db)
    assert_oracle(db)
    assert db.scalar(f"SELECT count(*) FROM {qualified(HOSTILE)}") == 3

    relid = project.relid(HOSTILE)
    hostile.write_text(config(HOSTILE, "1h") + body)
    out = project.ok("run", "-s", "hostile")
    assert f"pgtrickle: altered stream table {qualified(HOSTILE)} (schedule: 10m -> 1h)" in out, out
    assert project.relid(HOSTILE) == relid
    hostile.write_text(config(HOSTILE, "1h") + body.replace("<>", "="))
    out = project.ok("run", "-s", "hostile")
    assert f"pgtrickle: replacing stream table {qualified(HOSTILE)} (its defining query changed)" in out, out
    refresh(db)
    assert_oracle(db)

    # A model that was a table becomes a stream table.
    model = project.model("legacy")
    body = "select region, count(*) as customers from {{ ref('customers') }} group by region\n"
    model.write_text("{{ config(materialized='table') }}\n" + body)
    project.ok("run", "-s", "legacy")
    assert db.scalar("SELECT count(*) FROM pgtrickle.pgt_stream_tables WHERE pgt_name = 'legacy'") == 0
    grants = "grants={'select': ['pgtrickle_user']}"
    model.write_text(f"{{{{ config(materialized='stream_table', {grants}) }}}}\n" + body)
    out = project.ok("run", "-s", "legacy")
    assert f"pgtrickle: replacing table {qualified('legacy')}, which is not a stream table" in out, out
    # schedule not set: the default_schedule setting.
    assert db.sql("SELECT schedule FROM pgtrickle.stream_tables_info WHERE table_name = 'legacy'") == [
        ("1m",)
    ]
    assert (
        db.scalar("SELECT has_table_privilege('pgtrickle_user', %s, 'SELECT')", (qualified("legacy"),))
        is True
    )
    refresh(db)
    assert_oracle(db)
