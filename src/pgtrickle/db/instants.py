"""Catalog timestamps (watermarks) as Python reads them, whatever the catalog holds.

``advance_watermark`` accepts watermarks from 0001-01-02 to 9999-12-30
(UTC) only, but a catalog may hold one outside that range (written by an
older version, which accepted years after 9999, or by hand). Python's
``datetime`` cannot represent it, and psycopg's loader raises ``timestamp
too large``; read by the daemon, that stopped it at every start. So every
read of a watermark timestamp goes through :func:`parse_instant` (JSON
text) or a cursor from :func:`tolerant_cursor`, which read such a value as
:data:`FAR_PAST` or :data:`FAR_FUTURE`: still ordered correctly against every
valid watermark (so gating decides as PostgreSQL would), never an error.
The API then replaces it (docs/WATERMARKS.md).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TypeVar

import psycopg
from psycopg.types.datetime import IntervalLoader, TimestamptzLoader

FAR_FUTURE = datetime.max.replace(tzinfo=UTC)
"""A watermark after year 9999 (or ``infinity``) as Python sees it."""
FAR_PAST = datetime.min.replace(tzinfo=UTC)
"""A watermark before year 1 (BC, or ``-infinity``) as Python sees it."""

Row = TypeVar("Row")


def _beyond(text: str) -> datetime:
    """The stand-in of a timestamp text Python cannot represent (pure)."""
    t = text.strip().lower()
    if t.startswith("-infinity") or t.endswith(" bc") or t.startswith("-"):
        return FAR_PAST
    return FAR_FUTURE


def parse_instant(text: str) -> datetime:
    """A timestamptz text (ISO, as ``to_json`` writes it); out of range: FAR_PAST/FAR_FUTURE. Pure."""
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return _beyond(text)


class TolerantTimestamptzLoader(TimestamptzLoader):
    """psycopg's timestamptz loader, reading values beyond Python's range as FAR_PAST/FAR_FUTURE."""

    def load(self, data) -> datetime:
        try:
            return super().load(data)
        except psycopg.DataError:
            return _beyond(bytes(data).decode("ascii", "replace"))


class TolerantIntervalLoader(IntervalLoader):
    """psycopg's interval loader, reading ``±infinity`` (a lag to an infinite watermark) as a far stand-in."""

    def load(self, data) -> timedelta:
        try:
            return super().load(data)
        except psycopg.DataError:
            text = bytes(data).decode("ascii", "replace").strip().lower()
            return timedelta.min if text.startswith("-") else timedelta.max


def tolerant(cursor: psycopg.Cursor[Row]) -> psycopg.Cursor[Row]:
    """``cursor`` with timestamptz and interval values that Python cannot hold read as stand-ins."""
    cursor.adapters.register_loader("timestamptz", TolerantTimestamptzLoader)
    cursor.adapters.register_loader("interval", TolerantIntervalLoader)
    return cursor


def tolerant_cursor(conn: psycopg.Connection) -> psycopg.Cursor:
    """A cursor of ``conn`` reading out-of-range timestamptz values as FAR_PAST/FAR_FUTURE."""
    return tolerant(conn.cursor())
