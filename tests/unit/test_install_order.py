"""The SQL API's files: every one installed exactly once, in a declared order, each of a readable size.

Whether the order satisfies PostgreSQL (a SQL-language function or view is checked when created)
is proved by installing it: tests/integration/test_install.py."""

from __future__ import annotations

from pgtrickle.catalog import install


def _api_folder_files() -> set[str]:
    folder = install.sql_dir() / "api"
    return {f"api/{entry.name}" for entry in folder.iterdir() if entry.name.endswith(".sql")}


def test_every_api_file_is_installed_exactly_once() -> None:
    listed = install.SQL_API_FILES
    assert len(listed) == len(set(listed)), "a file is listed twice"
    assert {name for name in listed if name.startswith("api/")} == _api_folder_files()


def test_top_level_sql_files_are_installed_too() -> None:
    top = {entry.name for entry in install.sql_dir().iterdir() if entry.name.endswith(".sql")}
    assert top == {name for name in install.SQL_API_FILES if "/" not in name}


def test_order_is_the_declared_one_and_the_upgrade_step_runs_last() -> None:
    names = [name for name, _ in install.sql_api()]
    assert names == list(install.SQL_API_FILES)
    assert names[:2] == ["identity.sql", "capture_hierarchy.sql"]
    assert names[-2:] == ["api/90_entry_points.sql", "api/95_buffer_upgrade.sql"]


def test_no_sql_file_is_over_800_lines() -> None:
    for name, text in install.sql_api():
        assert len(text.splitlines()) <= 800, name
