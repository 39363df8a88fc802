"""The order pytest-xdist hands the tests out in (tests/conftest.py): heaviest first."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import EXPECTED_SECONDS, XDIST_GROUPS, expected_seconds, xdist_scope

ROOT = Path(__file__).resolve().parents[2]


def test_the_longest_matching_prefix_counts() -> None:
    assert expected_seconds("tests/integration/test_dbt.py::test_example_project_create[x]") == 280
    assert expected_seconds("tests/integration/test_dbt.py::test_bad_config_fails") == 130
    assert expected_seconds("tests/integration/test_sql_api.py::test_anything") == 5.0
    assert expected_seconds("tests/unit/test_cron.py::test_anything") == 0.0


def test_every_prefix_names_a_test_file_and_test_that_exist() -> None:
    """A renamed test would silently lose its place at the front of the run."""
    for prefix in EXPECTED_SECONDS:
        path, _, name = prefix.partition("::")
        source = ROOT / path
        assert source.is_file(), prefix
        if name:
            assert re.search(rf"^def {re.escape(name)}", source.read_text(), re.MULTILINE), prefix


def test_a_grouped_file_is_one_unit_of_work_and_other_tests_are_their_own() -> None:
    connect = "tests/integration/test_spark_connect.py::test_a_value_spark_cannot_carry[FULL]"
    assert xdist_scope(connect) == "spark_connect"
    assert xdist_scope("tests/integration/test_spark_connect.py::test_cli") == "spark_connect"
    assert xdist_scope("tests/integration/test_dbt.py::test_x") == "tests/integration/test_dbt.py::test_x"
    assert all((ROOT / prefix.partition("::")[0]).is_file() for prefix in XDIST_GROUPS)
