"""Several deltas as one Spark query: their union, each row tagged with the target it belongs to (pure).

One action then computes them all: the members of a batch (refresh/batch.py), a kept shape's
hidden tables and stream table (refresh/differential.py). Each part is a query of its values
(``c0``..), the weight ``__pgt_w`` and the row identity ``__pgt_row_id``. In the union a row is
``__pgt_member`` (its part's tag), then the struct columns ``m0``.. (a part's values in its
slot's column, NULL in the others), weight and row identity.

Each part has a slot of its own unless the caller knows parts whose values have the same Spark
types (:func:`shared_slots`; refresh/union_types.py knows them): those share one. A slot's NULLs
are typed as its parts' struct, so no value changes type; parts of different types never share
one, where Spark's union would widen them to a common type (a ``decimal(10,2)`` value next to a
``decimal(12,4)`` one would come back with four decimals). Sharing keeps the union as narrow as
its distinct types: a slot per part makes the union's width, and Spark's analysis and planning of
it, grow with the square of the parts (a batch of 60 members: 60 struct columns in each of 60
branches).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any

from pgtrickle.dvm import ir
from pgtrickle.dvm.layout import ROW_ID

__all__ = ["MEMBER", "SMALL_UNION_ROWS", "shared_slots", "split_rows", "union_sql"]

MEMBER = "__pgt_member"
"""The tag column of a union: the tag (a batch member's pgt_id) of the part a row belongs to."""

SMALL_UNION_ROWS = 50_000
"""A union of fewer changes is consolidated in one partition (one task scans every part's reads,
rather than one task per part)."""


def shared_slots(types: Sequence[Hashable | None]) -> list[int]:
    """Each part's slot: parts of the same known type (not ``None``) share the first one's, a
    part of unknown type has one of its own; slots numbered from 0 in order of first use.

    >>> shared_slots(["struct<c0:int>", None, "struct<c0:int>", "struct<c0:bigint>", None])
    [0, 1, 0, 2, 3]
    """
    slots: list[int] = []
    first: dict[Hashable, int] = {}
    count = 0
    for known in types:
        if known is None:
            slots.append(count)
            count += 1
        elif known in first:
            slots.append(first[known])
        else:
            first[known] = count
            slots.append(count)
            count += 1
    return slots


def union_sql(
    members: Sequence[int],
    widths: Sequence[int],
    texts: Sequence[str],
    changes: int,
    slots: Sequence[int] | None = None,
) -> str:
    """The parts' deltas (``texts``: c0.., ``__pgt_w``, ``__pgt_row_id``) unioned, part ``i``'s
    values in the struct column ``m<slots[i]>`` (``c0``..; by default each part its own slot,
    ``slots[i] = i``), consolidated: grouped by tag and row, weights summed, rows whose weights
    cancel dropped. Columns: ``__pgt_member``, ``m0``.., ``__pgt_w``, ``__pgt_row_id``."""
    slots = list(range(len(members))) if slots is None else list(slots)
    structs = [f"m{k}" for k in range(max(slots, default=-1) + 1)]
    branches = []
    for i, (pgt_id, width, text) in enumerate(zip(members, widths, texts, strict=True)):
        struct = "named_struct(" + ", ".join(f"'c{j}', c{j}" for j in range(width)) + ")"
        items = [f"CAST({int(pgt_id)} AS BIGINT) AS {MEMBER}"]
        items += [
            f"{struct} AS {name}" if k == slots[i] else f"NULL AS {name}" for k, name in enumerate(structs)
        ]
        items += [ir.WEIGHT, ROW_ID]
        branches.append(f"SELECT {', '.join(items)} FROM ({text}) AS __pgt_b{i}")
    hint = "/*+ COALESCE(1) */ " if changes < SMALL_UNION_ROWS else ""
    keys = ", ".join([MEMBER, *structs, ROW_ID])
    return (
        f"SELECT {MEMBER}, {', '.join(structs)}, CAST(SUM({ir.WEIGHT}) AS BIGINT) AS {ir.WEIGHT}, {ROW_ID} "
        f"FROM (SELECT {hint}* FROM ({' UNION ALL '.join(branches)}) AS __pgt_u) AS __pgt_c "
        f"GROUP BY {keys} HAVING SUM({ir.WEIGHT}) <> 0"
    )


def split_rows(
    rows: Iterable[Sequence[Any]], members: Sequence[int], slots: Sequence[int] | None = None
) -> dict[int, list[tuple]]:
    """The collected rows of a :func:`union_sql` query (with the same ``slots``), per tag: each
    row its part's values, weight and row identity."""
    slot = {tag: (i if slots is None else slots[i]) for i, tag in enumerate(members)}
    split: dict[int, list[tuple]] = {tag: [] for tag in members}
    for row in rows:
        split[row[0]].append((*row[1 + slot[row[0]]], row[-2], row[-1]))
    return split
