"""Shared pytest configuration for the unit tests."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers used by the unit tests."""
    config.addinivalue_line(
        "markers",
        "spark: starts a real local SparkSession (needs Java); deselect with -m 'not spark'",
    )
