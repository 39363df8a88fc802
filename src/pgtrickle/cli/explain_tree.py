"""The operator tree ``pgtrickle explain`` shows: planned from the catalog, rendered as text or JSON.

:func:`plan_tree` plans the stream table's normalized query with the delta
engine (:func:`pgtrickle.dvm.pipeline.plan_delta`) over the sources' columns
and types from the catalog, as if every source changed; a query the engine
cannot plan gives an :class:`OperatorTree` whose ``error`` names the
construct instead (never a traceback). :func:`tree_lines` and
:func:`tree_document` render it: one line per node (operator and key facts,
the rule computing its change, ``materialized: <reason>`` for a node kept in
a hidden state table, then one line per hidden state table with its name in
the catalog), or nested objects for ``--json`` (docs/CLI.md).

Pure: the catalog's facts come in as :class:`~pgtrickle.catalog.store.StreamTable`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pgtrickle.catalog.store import StreamTable
from pgtrickle.dvm import ir
from pgtrickle.dvm.describe import describe_plan, facts
from pgtrickle.dvm.pipeline import DeltaPlan, Step, plan_delta
from pgtrickle.errors import NoDeltaRuleError, PgTrickleError

HIDDEN_PREFIX = "__pgt_"
"""Columns of a stream table source that pgtrickle keeps for itself (not visible to queries)."""


@dataclass(frozen=True)
class TreeError:
    """Why the operator tree cannot be built."""

    type: str
    """The error class (``NoDeltaRuleError``, ``UnsupportedQueryError``, ...)."""
    construct: str | None
    """The construct without a delta rule (``WITH RECURSIVE``, ``LATERAL``, ...), when one is named."""
    message: str


@dataclass(frozen=True)
class OperatorTree:
    """The planned tree (``plan``) or why there is none (``error``)."""

    plan: DeltaPlan | None
    error: TreeError | None = None
    state_tables: Mapping[int, str] = field(default_factory=dict)
    """The stream table's hidden state tables in the catalog: position → qualified name."""


def relations_of(st: StreamTable) -> tuple[dict[str, list[str]], dict[str, dict[str, str]]]:
    """(columns, types) of every source, keyed ``schema.name`` as the normalized query names them."""
    columns: dict[str, list[str]] = {}
    types: dict[str, dict[str, str]] = {}
    for source in st.sources:
        key = f"{source.schema}.{source.name}"
        visible = [(c, t) for c, t in source.column_types if not c.startswith(HIDDEN_PREFIX)]
        columns[key] = [c for c, _ in visible]
        types[key] = dict(visible)
    return columns, types


def plan_tree(st: StreamTable, state_tables: Mapping[int, str] | None = None) -> OperatorTree:
    """Plan ``st``'s query for explain (every source changed; Spark's dialect, as a refresh runs it;
    kept nodes read from their hidden state tables). ``state_tables``: the stream table's hidden
    state tables in the catalog (``pgtrickle.pgt_state_tables``), position → qualified name."""
    columns, types = relations_of(st)
    try:
        plan = plan_delta(st.normalized_query, columns, types, set(columns), "spark", keep_state=True)
    except NoDeltaRuleError as exc:
        return OperatorTree(None, TreeError(type(exc).__name__, exc.construct, str(exc)))
    except PgTrickleError as exc:
        return OperatorTree(None, TreeError(type(exc).__name__, None, str(exc)))
    return OperatorTree(plan, state_tables=dict(state_tables or {}))


def kept_nodes(plan: DeltaPlan) -> list[ir.Node]:
    """The nodes kept in hidden state tables, in their tables' positions (children first; the
    order of :func:`pgtrickle.dvm.kept.plan_state_tables`)."""
    return [n for n in ir.walk(plan.tree) if n is not plan.tree and n in plan.materialized]


def _state_tables(tree: OperatorTree) -> list[dict[str, Any]]:
    assert tree.plan is not None
    return [
        {
            "position": position,
            "table": tree.state_tables.get(position),
            "operator": type(node).__name__,
            "reason": tree.plan.materialized[node],
        }
        for position, node in enumerate(kept_nodes(tree.plan))
    ]


def tree_lines(tree: OperatorTree) -> list[str]:
    """The text of the operator tree: one line per node, root first, children indented."""
    if tree.plan is None:
        assert tree.error is not None
        return [f"no operator tree: {tree.error.message}"]
    lines = describe_plan(tree.plan).splitlines()
    kept = _state_tables(tree)
    if kept:
        lines.append("hidden state tables:")
    for table in kept:
        name = table["table"] or "(not made yet: the next refresh makes and fills it)"
        lines.append(f"  {name}: {table['operator']}, {table['reason']}")
    reason = tree.plan.full_refresh_reason
    if reason is not None:
        lines.append(f"(a differential refresh of this plan runs FULL for now: {reason})")
    return lines


def tree_document(tree: OperatorTree) -> dict[str, Any]:
    """``operator_tree`` of ``pgtrickle explain --json``: the root node as nested objects, or the error."""
    if tree.plan is None:
        assert tree.error is not None
        return {
            "root": None,
            "full_refresh_reason": None,
            "state_tables": [],
            "error": {
                "type": tree.error.type,
                "construct": tree.error.construct,
                "message": tree.error.message,
            },
        }
    steps = {id(s.node): s for s in tree.plan.steps}
    return {
        "root": _node(tree.plan.tree, steps, set()),
        "full_refresh_reason": tree.plan.full_refresh_reason,
        "state_tables": _state_tables(tree),
        "error": None,
    }


def _node(node: ir.Node, steps: Mapping[int, Step], seen: set[int]) -> dict[str, Any]:
    operator = type(node).__name__
    if id(node) in seen:  # a subtree read twice (a CTE used twice): described at its first reader
        return {"operator": operator, "facts": facts(node), "shared": True, "inputs": []}
    seen.add(id(node))
    step = steps[id(node)]
    return {
        "operator": operator,
        "facts": facts(node),
        "columns": list(node.columns),
        "rule": step.rule,
        "materialized": step.materialized,
        "shared": False,
        "inputs": [_node(child, steps, seen) for child in node.inputs],
    }
