"""Shared pytest configuration for the unit tests: no JVM, no database.

Every phase of every unit test (fixture set-up, the test, tear-down) runs with the doors to
Spark and PostgreSQL closed (tests/unit/isolation.py): a unit test that tries to start a
SparkSession or open a connection fails, naming what it tried.  These hooks run for the items
under tests/unit only (pytest calls a conftest's run-test hooks for the items below it).
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from tests.unit.isolation import MOVE_HINT, forbidden_resources


def _guarded() -> Generator[None, object, object]:
    with forbidden_resources() as seen:
        result = yield
    if seen:
        pytest.fail(f"{'; '.join(seen)} — {MOVE_HINT}", pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    return (yield from _guarded())
