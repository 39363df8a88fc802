"""Reading single rows and values, typed: a statement that must return a row and returned none is a
:class:`LookupError` naming it, not an ``IndexError`` on ``None``."""

from __future__ import annotations

from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.abc import Params

Row = TypeVar("Row")


def one_row(cur: psycopg.Cursor[Row]) -> Row:
    """The next row of ``cur``, which must have one (an aggregate, a function call, ``RETURNING``)."""
    row = cur.fetchone()
    if row is None:
        raise LookupError(f"the statement returned no row (status {cur.statusmessage!r})")
    return row


def scalar(
    conn: psycopg.Connection[Any], query: str | bytes | sql.SQL | sql.Composed, params: Params | None = None
) -> Any:
    """The first column of the one row ``query`` returns."""
    return one_row(conn.execute(query, params))[0]
