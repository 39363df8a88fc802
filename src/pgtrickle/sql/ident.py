"""Quoting SQL identifiers (pure; shared by the catalog, the delta engine and the refresh)."""

from __future__ import annotations


def quote_ident(name: str) -> str:
    """Quote an identifier for SQL (always quoting, so any name is safe)."""
    return '"' + name.replace('"', '""') + '"'
