"""Several deltas as one Spark query: their union, each row tagged with the target it belongs to (pure).

One action then computes them all: the members of a batch (refresh/batch.py), a kept shape's
hidden tables and stream table (refresh/differential.py). Each part is a query of its values
(``c0``..), the weight ``__pgt_w`` and the row identity ``__pgt_row_id``. In the union a row is
``__pgt_member`` (its part's tag), then part ``i``'s values in the struct column ``m<i>`` (NULL
in the other parts' rows, which Spark types as part ``i``'s, so no value changes type), weight
and row identity.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pgtrickle.dvm import ir
from pgtrickle.dvm.layout import ROW_ID

__all__ = ["MEMBER", "SMALL_UNION_ROWS", "split_rows", "union_sql"]

MEMBER = "__pgt_member"
"""The tag column of a union: the tag (a batch member's pgt_id) of the part a row belongs to."""

SMALL_UNION_ROWS = 50_000
"""A union of fewer changes is consolidated in one partition (one task scans every part's reads,
rather than one task per part)."""


def union_sql(members: Sequence[int], widths: Sequence[int], texts: Sequence[str], changes: int) -> str:
    """The parts' deltas (``texts``: c0.., ``__pgt_w``, ``__pgt_row_id``) unioned, part ``i``'s
    values in the struct column ``m<i>`` (``c0``..), consolidated: grouped by tag and row, weights
    summed, rows whose weights cancel dropped. Columns: ``__pgt_member``, ``m0``.., ``__pgt_w``,
    ``__pgt_row_id``."""
    structs = [f"m{i}" for i in range(len(members))]
    branches = []
    for i, (pgt_id, width, text) in enumerate(zip(members, widths, texts, strict=True)):
        struct = "named_struct(" + ", ".join(f"'c{j}', c{j}" for j in range(width)) + ")"
        items = [f"CAST({int(pgt_id)} AS BIGINT) AS {MEMBER}"]
        items += [f"{struct} AS {name}" if k == i else f"NULL AS {name}" for k, name in enumerate(structs)]
        items += [ir.WEIGHT, ROW_ID]
        branches.append(f"SELECT {', '.join(items)} FROM ({text}) AS __pgt_b{i}")
    hint = "/*+ COALESCE(1) */ " if changes < SMALL_UNION_ROWS else ""
    keys = ", ".join([MEMBER, *structs, ROW_ID])
    return (
        f"SELECT {MEMBER}, {', '.join(structs)}, CAST(SUM({ir.WEIGHT}) AS BIGINT) AS {ir.WEIGHT}, {ROW_ID} "
        f"FROM (SELECT {hint}* FROM ({' UNION ALL '.join(branches)}) AS __pgt_u) AS __pgt_c "
        f"GROUP BY {keys} HAVING SUM({ir.WEIGHT}) <> 0"
    )


def split_rows(rows: Iterable[Sequence[Any]], members: Sequence[int]) -> dict[int, list[tuple]]:
    """The collected rows of a :func:`union_sql` query, per tag: each row its part's values,
    weight and row identity."""
    index = {tag: i for i, tag in enumerate(members)}
    split: dict[int, list[tuple]] = {tag: [] for tag in members}
    for row in rows:
        split[row[0]].append((*row[1 + index[row[0]]], row[-2], row[-1]))
    return split
