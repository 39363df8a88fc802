"""The refresh mode of a defining query and the physical layout it needs.

Pure: :func:`decide_mode` plans the query's change once as if every relation under it changed
(:func:`pgtrickle.dvm.pipeline.plan_delta`): DIFFERENTIAL is possible when that succeeds;
otherwise the reason names the construct. Nodes the rules cannot re-derive cheaply are kept in
hidden state tables (:mod:`pgtrickle.dvm.kept`, :attr:`Layout.state_tables`). :func:`plan_layout` says
which columns the table stores (hidden ``__pgt_*`` state columns for a stored aggregate,
:mod:`pgtrickle.dvm.stored`) and what its row identity ``__pgt_row_id`` hashes;
``refresh/layout_ddl.py`` makes the table match.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pgtrickle.dvm import ir
from pgtrickle.dvm.kept import StateTable, plan_state_tables
from pgtrickle.dvm.pipeline import plan_delta
from pgtrickle.dvm.stored import StoredAggregate, average_of, stored_aggregate
from pgtrickle.errors import UnsupportedQueryError

ROW_ID = "__pgt_row_id"

AUTO_KEEPS_NO_STATE = (
    "refresh_mode AUTO refreshes it FULL, which is faster today; refresh_mode => 'DIFFERENTIAL' "
    "keeps that state in hidden state tables and refreshes it differentially"
)
"""Why ``AUTO`` refreshes a query that needs hidden state tables FULL (see :func:`decide_mode`)."""

__all__ = ["AUTO_KEEPS_NO_STATE", "ROW_ID", "DeltaMode", "Layout", "decide_mode", "plan_layout"]


@dataclass(frozen=True, eq=False)
class DeltaMode:
    """Whether the query can be refreshed DIFFERENTIAL, and why (not)."""

    differential: bool
    reason: str
    tree: ir.Node | None = None
    stored: StoredAggregate | None = None
    rules: str = ""
    """The rule of every operator (children first), e.g. ``Scan: change buffer; Aggregate: ...``."""
    kept: Mapping[ir.Node, str] = field(default_factory=dict)
    """Nodes of :attr:`tree` kept in hidden state tables (:mod:`pgtrickle.dvm.kept`), and why."""


def _rules(plan_steps: Sequence[tuple[str, str]]) -> str:
    return "; ".join(f"{kind}: {rule}" for kind, rule in plan_steps)


def decide_mode(
    pg_sql: str,
    schema: Mapping[str, Sequence[str]],
    column_types: Mapping[str, Mapping[str, str]],
    visible: Sequence[str],
    keep_state: bool = True,
) -> DeltaMode:
    """Plan ``pg_sql`` as if every relation changed (see the module docstring).

    ``keep_state``: whether the nodes the rules keep may live in hidden state tables. The refresh
    passes it for ``refresh_mode => 'DIFFERENTIAL'`` only: under ``AUTO`` such a query refreshes
    FULL, with :data:`AUTO_KEEPS_NO_STATE` in its reason, because its differential refresh is still
    slower than FULL (docs/BENCHMARKS.md, "Hidden state tables").
    """
    try:
        plan = plan_delta(pg_sql, schema, column_types, set(schema), "spark", keep_state=keep_state)
    except UnsupportedQueryError as err:
        return DeltaMode(False, f"no delta rule: {err}")
    # A query that keeps inner nodes in hidden tables recomputes its root's touched groups.
    stored = None if plan.materialized else stored_aggregate(plan.tree, visible, column_types)
    steps = []
    for step in plan.steps:
        rule = step.rule
        if stored is not None and step.node is stored.root:
            rule = "algebraic over stored state"
        elif stored is not None and stored.derived and step.node is plan.tree:
            rule = "arithmetic of the stored state, in PostgreSQL"
        steps.append((type(step.node).__name__, rule))
    rules = _rules(steps)
    reason = plan.full_refresh_reason
    if reason is not None:
        if not keep_state and plan.materialized:
            reason = f"{reason}; {AUTO_KEEPS_NO_STATE}"
        return DeltaMode(False, reason, plan.tree, None, rules)
    return DeltaMode(True, f"differential: {rules}", plan.tree, stored, rules, dict(plan.materialized))


@dataclass(frozen=True, eq=False)
class Layout:
    columns: tuple[str, ...]
    """Stored columns a refresh writes, in order (``__pgt_row_id`` aside; a stored aggregate's
    AVG columns are computed in PostgreSQL, see :attr:`finalize`)."""
    hidden: tuple[str, ...]
    key_positions: tuple[int, ...]
    """Positions in ``columns`` hashed into ``__pgt_row_id``."""
    differential: bool
    stored: StoredAggregate | None = None
    """Set when the table keeps its root aggregate's state: FULL computes the state plan."""
    unique_keys: bool = False
    """One row per key (groups): a unique index on the key guards the apply."""
    finalize: str = ""
    """SQL run after a FULL refresh: the AVG columns computed from the exact state columns."""
    state_tables: tuple[StateTable, ...] = ()
    """The hidden tables of the nodes the query keeps (:mod:`pgtrickle.dvm.kept`), children first."""


def average_expression(sum_column: str, count_column: str, pg_type: str, qualifier: str = "") -> str:
    """PostgreSQL's ``avg`` from its stored sum and count: ``sum / count`` in the AVG's own type
    (``numeric`` for integers and numerics, ``double precision`` for floats), NULL without values."""
    from pgtrickle.sql.ident import quote_ident

    return average_of(
        f"{qualifier}{quote_ident(sum_column)}", f"{qualifier}{quote_ident(count_column)}", pg_type
    )


def plan_layout(
    visible: tuple[str, ...],
    visible_types: Mapping[str, str],
    target: str,
    mode: DeltaMode,
    differential: bool,
    *,
    pgt_id: int = 0,
    relations: Mapping[str, tuple[str, str]] | None = None,
    column_types: Mapping[str, Mapping[str, str]] | None = None,
) -> Layout:
    """The layout of the stream table ``target`` (quoted name) with the visible columns
    ``visible`` (``visible_types``: their PostgreSQL types). ``pgt_id``, ``relations`` (a
    relation of the query → its ``(schema, table)``) and ``column_types`` name and type the
    hidden state tables of a query that keeps nodes."""
    stored = mode.stored if differential else None
    if stored is None:
        tables: tuple[StateTable, ...] = ()
        if differential and mode.kept and mode.tree is not None and relations is not None:
            tables = tuple(plan_state_tables(pgt_id, mode.tree, mode.kept, relations, column_types))
        return Layout(visible, (), tuple(range(len(visible))), differential, state_tables=tables)
    from pgtrickle.sql.ident import quote_ident

    columns = stored.written
    positions = tuple(columns.index(k) for k in stored.keys)
    finalize = ""
    assignments = [
        f"{quote_ident(a.column)} = "
        + average_expression(a.sum_column, a.count_column, visible_types.get(a.column, "numeric"))
        for a in stored.averages
    ] + [f"{quote_ident(d.column)} = {stored.derived_sql(d, quote_ident)}" for d in stored.derived]
    if assignments:
        finalize = f"UPDATE {target} SET {', '.join(assignments)}"
    return Layout(
        columns,
        stored.hidden,
        positions,
        differential,
        stored,
        unique_keys=bool(stored.keys),
        finalize=finalize,
    )
