"""The import-linter contracts of pyproject.toml (docs/ARCHITECTURE.md, "Layers") hold, and break when
an upward import, a cycle or I/O in the delta engine is added to a copy of the sources."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed")


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(tree / "pyproject.toml")],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the package and the contracts, to add a bad import to."""
    shutil.copytree(
        ROOT / "src" / "pgtrickle",
        tmp_path / "src" / "pgtrickle",
        ignore=shutil.ignore_patterns("__pycache__", "*.sql"),
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _add_import(tree: Path, module: str, line: str) -> None:
    path = tree / "src" / Path(*module.split(".")).with_suffix(".py")
    path.write_text(path.read_text() + f"\n{line}\n")


def test_the_sources_keep_every_contract(tree: Path) -> None:
    result = _lint(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # The catalog reaching up into the refresh engine: an upward import.
        ("pgtrickle.catalog.store", "from pgtrickle.refresh import engine", "Packages import only downwards"),
        # A decision module of the scheduler reaching the daemon above it.
        ("pgtrickle.scheduler.policy", "import pgtrickle.daemon.loop", "Packages import only downwards"),
        # The engine importing the atomic group that imports it: a cycle inside refresh/.
        ("pgtrickle.refresh.engine", "import pgtrickle.refresh.group", "No import cycles"),
        # The delta engine touching the database.
        ("pgtrickle.dvm.keyed", "import psycopg", "The delta engine (pgtrickle.dvm, every module) is pure"),
    ],
)
def test_an_added_bad_import_breaks_a_contract(tree: Path, module: str, line: str, broken: str) -> None:
    _add_import(tree, module, line)
    result = _lint(tree)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout
    broken_section = result.stdout.split("Broken contracts", 1)[1]
    assert broken in broken_section, result.stdout
