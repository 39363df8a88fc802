"""The physical layout a stream table needs for its refresh mode: hidden columns, row identity.

Pure: :func:`plan_layout` decides; ``refresh/layout_ddl.py`` makes the table
match (adding or dropping hidden ``__pgt_*`` state columns, the index on
``__pgt_row_id``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pgtrickle.dvm import aggregate as agg_rules
from pgtrickle.dvm.analysis import ALGEBRAIC, AggregateShape, Analysis


@dataclass(frozen=True)
class Layout:
    query_sql: str
    """What a FULL refresh computes: the defining query, or the state query with hidden columns."""
    columns: tuple[str, ...]
    """Stored columns in the order ``query_sql`` returns them (``__pgt_row_id`` aside)."""
    hidden: tuple[str, ...]
    key_positions: tuple[int, ...]
    """Positions in ``columns`` hashed into ``__pgt_row_id``."""
    differential: bool
    unique_keys: bool = False
    """One row per key (groups, DISTINCT): a unique index on the key guards the merge."""
    finalize: str = ""
    """SQL run after a FULL refresh: aggregate outputs recomputed from the exact state columns."""


def plan_layout(
    query_sql: str, visible: tuple[str, ...], target: str, analysis: Analysis, differential: bool
) -> Layout:
    """The layout of the stream table ``target`` (quoted name) whose defining query is ``query_sql``,
    with the visible columns ``visible``."""
    shape = analysis.shape
    if not differential or not isinstance(shape, AggregateShape):
        return Layout(query_sql, visible, (), tuple(range(len(visible))), differential)
    hidden = shape.hidden_columns()
    columns = visible + hidden
    positions = tuple(columns.index(k.column) for k in shape.keys)
    finalize = ""
    if shape.strategy == ALGEBRAIC:
        finalize = agg_rules.finalize_statement(shape, target, visible)
    return Layout(
        agg_rules.state_query(shape).sql("postgres"),
        columns,
        hidden,
        positions,
        differential,
        unique_keys=not shape.many_rows_per_key and bool(shape.keys),
        finalize=finalize,
    )
