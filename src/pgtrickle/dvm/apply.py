"""PostgreSQL statements applying a consolidated linear delta (pure SQL text).

``__pgt_delta`` holds one row per distinct changed row: the visible columns,
``__pgt_row_id`` (the content hash, indexed in the stream table), the net
weight ``__pgt_w`` (≠ 0) and a sequence number ``__pgt_seq``. A negative
weight deletes that many copies, a positive one inserts that many. Deletes
and inserts are explicit statements, so triggers on the stream table see
correct OLD / NEW rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pgtrickle.dvm.aggregate import DELTA_TABLE, ROW_ID, same_value
from pgtrickle.sql.ident import quote_ident


@dataclass(frozen=True)
class LinearSql:
    delete: str
    """Deletes the copies; returns the deleted rows' visible columns."""
    insert: str
    """Inserts the copies; returns the inserted rows' visible columns."""
    expected_deletes: str
    """How many rows ``delete`` must remove (else the delta does not match the table)."""


def linear_statements(
    target: str, columns: Sequence[str], equality: Mapping[str, str] | None = None
) -> LinearSql:
    d = DELTA_TABLE
    equality = equality or {}
    same = " AND ".join(
        [f"t.{ROW_ID} = d.{ROW_ID}"]
        + [same_value(f"t.{quote_ident(c)}", f"d.{quote_ident(c)}", equality.get(c)) for c in columns]
    )
    returning = ", ".join(f"t.{quote_ident(c)}" for c in columns) or "1"
    delete = (
        f"DELETE FROM {target} AS t WHERE t.ctid = ANY(ARRAY("
        f"SELECT x.tid FROM (SELECT t.ctid AS tid, -d.__pgt_w AS n,"
        f" row_number() OVER (PARTITION BY d.__pgt_seq ORDER BY t.ctid) AS rn"
        f" FROM {target} AS t JOIN {d} AS d ON {same} WHERE d.__pgt_w < 0) x WHERE x.rn <= x.n))"
        f" RETURNING {returning}"
    )
    cols = ", ".join([*(quote_ident(c) for c in columns), ROW_ID])
    d_cols = ", ".join([*(f"d.{quote_ident(c)}" for c in columns), f"d.{ROW_ID}"])
    insert = (
        f"INSERT INTO {target} AS t ({cols}) SELECT {d_cols} FROM {d} AS d"
        f" CROSS JOIN LATERAL generate_series(1, d.__pgt_w) WHERE d.__pgt_w > 0"
        f" RETURNING {returning}"
    )
    expected = f"SELECT coalesce(sum(-__pgt_w), 0) FROM {d} WHERE __pgt_w < 0"
    return LinearSql(delete, insert, expected)
