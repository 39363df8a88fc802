"""The compositional delta engine end to end: defining query text → one consolidated delta query.

Pure: no I/O. :func:`plan_delta` composes the pieces a differential refresh runs through —
:func:`pgtrickle.sql.translate.parse_query` → :func:`pgtrickle.dvm.lower.lower` →
:func:`pgtrickle.dvm.materialize.decide` → :func:`pgtrickle.dvm.rules.delta` →
:func:`pgtrickle.dvm.compile.compile_ir` → :meth:`~pgtrickle.dvm.compile.Compiled.consolidated`
— and returns a :class:`DeltaPlan` carrying everything the caller needs:

- ``compiled``: the consolidated delta query (``columns`` then ``__pgt_w``) and its ``reads``,
  which the caller registers (a temporary view on Spark) before running it; ``None`` when no
  relation under the query is in ``changed`` (the stream table does not change);
- ``steps``: per IR node of the defining query (children first), the rule that computes its
  change (:func:`rule_of`) and, for a node kept as a hidden stream table, the reason;
- ``state_changes``: with ``keep_state``, per node kept in a hidden state table, the change to
  apply to that table; the plan reads the tables as stored (:mod:`pgtrickle.dvm.integrate`);
- ``full_refresh_reason``: set when the plan reads kept nodes without ``keep_state`` (or the
  stored aggregate state): the caller must refresh FULL, with that reason, rather than run the
  plan. The plan is still complete, so tests (and ``explain``) can read it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from pgtrickle.dvm import ir, kept_state, materialize, rules, semijoin_counts
from pgtrickle.dvm.compile import Compiled, Reads, compile_ir
from pgtrickle.dvm.compile_sql import Dialect
from pgtrickle.dvm.integrate import integrate
from pgtrickle.dvm.lower import lower
from pgtrickle.dvm.rules import aggregate as aggregate_rule
from pgtrickle.dvm.stored import not_storable
from pgtrickle.sql.translate import parse_query

__all__ = ["DeltaPlan", "Step", "ViewNames", "plan_delta", "rule_of", "steps_of"]

LINEAR = "linear"
CHANGE_BUFFER = "change buffer"
CONSTANT = "constant: never changes"
UNCHANGED = "unchanged: no changed relation under it"
HIDDEN_TABLE = "(in its hidden table; read as its change buffer)"
RECOMPUTE_GROUPS = "touched groups, recompute"
KEPT_GROUPS = "touched groups: old rows from its hidden table, new ones recomputed"
RECOMPUTE_ONE_ROW = "single row, recompute before and after"
ALGEBRAIC = "algebraic over stored state"
DISTINCT_COUNTS = "row counts (touched rows, recompute)"
TOUCHED_ROWS = "touched rows, recompute"
TOUCHED_PARTITIONS = "touched partitions, recompute"
TOPK_DIFFERENCE = "visible rows before and after"
SEMI_JOIN = "semi join: telescoping + existence flips of touched rows"
ANTI_JOIN = "anti join: telescoping + existence flips of touched rows"
STORED_STATE = "the stream table's stored aggregate state (algebraic rule)"
OUTER_JOIN = "outer join: inner part telescoping + padded anti-join part"


@dataclass(frozen=True)
class Step:
    """One node of the defining query's tree: the rule computing its change, and, when it is kept
    as a hidden stream table, why (``materialized``)."""

    node: ir.Node
    rule: str
    materialized: str | None = None


@dataclass(frozen=True)
class DeltaPlan:
    """See the module docstring."""

    tree: ir.Node
    steps: tuple[Step, ...]
    materialized: Mapping[ir.Node, str]
    plan: ir.Node | None
    compiled: Compiled | None
    state_changes: tuple[tuple[ir.Node, Compiled | None], ...] = ()
    """With ``keep_state``: per kept node (children first), the consolidated change to apply to
    its hidden state table (``None``: unchanged); the plan then reads those tables as stored."""
    state_plans: tuple[ir.Node | None, ...] = ()
    """The IR plans of :attr:`state_changes`, in the same order."""

    @property
    def full_refresh_reason(self) -> str | None:
        """Why the caller must refresh FULL instead of running the plan (``None``: run it)."""
        if self.plan is None:
            return None
        kept = {node for node, _ in self.state_changes}
        hidden = {
            n.node: None for n in ir.walk(self.plan) if isinstance(n, ir.Materialized) and n.node not in kept
        }
        if not hidden:
            return None
        reasons = [self.materialized.get(node, STORED_STATE) for node in hidden]
        return "needs a hidden stream table, not built yet: " + "; ".join(dict.fromkeys(reasons))

    def step(self, node: ir.Node) -> Step:
        """The step of ``node`` (a node of :attr:`tree`)."""
        for step in self.steps:
            if step.node is node:
                return step
        raise KeyError("the node is not in the plan's tree")


def _touched(node: ir.Node, changed: Collection[str] | None, memo: dict[ir.Node, bool]) -> bool:
    if changed is None:
        return True
    if node not in memo:
        if isinstance(node, ir.Scan):
            memo[node] = node.relation in changed
        else:
            memo[node] = any(_touched(child, changed, memo) for child in node.inputs)
    return memo[node]


def _join_terms(node: ir.Node, changed: Collection[str] | None, memo: dict[ir.Node, bool]) -> int:
    """How many terms the telescoping rule gives an inner join: one per changed input, the left
    input's own terms distributed when it is itself an inner join."""
    if not (isinstance(node, ir.Join) and node.kind is ir.JoinKind.INNER):
        return 1 if _touched(node, changed, memo) else 0
    left = _join_terms(node.left, changed, memo)
    return left + (1 if _touched(node.right, changed, memo) else 0)


def rule_of(
    node: ir.Node,
    *,
    changed: Collection[str] | None = None,
    is_root: bool = False,
    stored_state: bool = False,
    materialized: Collection[ir.Node] = (),
    _memo: dict[ir.Node, bool] | None = None,
) -> str:
    """The rule computing ``node``'s change (``changed=None``: as if every relation changed)."""
    memo: dict[ir.Node, bool] = {} if _memo is None else _memo
    if isinstance(node, ir.Values):
        return CONSTANT
    if not _touched(node, changed, memo):
        return UNCHANGED
    if not is_root and any(m is node for m in materialized):
        if aggregate_rule.original_of(node) is not None:
            own = ALGEBRAIC
        elif aggregate_rule.kept_aggregate(node) is not None:
            own = KEPT_GROUPS
        else:
            own = rule_of(node, changed=changed, stored_state=False, _memo=memo)
        return f"{own} {HIDDEN_TABLE}"
    if isinstance(node, ir.Scan):
        return CHANGE_BUFFER
    if isinstance(node, (ir.Filter, ir.Project, ir.UnionAll)):
        return LINEAR
    if isinstance(node, ir.Join):
        if node.kind is ir.JoinKind.INNER:
            return f"telescoping join: {_join_terms(node, changed, memo)} terms"
        if node.kind is ir.JoinKind.SEMI:
            return SEMI_JOIN
        if node.kind is ir.JoinKind.ANTI:
            return ANTI_JOIN
        return OUTER_JOIN
    if isinstance(node, ir.Aggregate):
        if is_root and stored_state and aggregate_rule.invertible(node):
            return ALGEBRAIC
        return RECOMPUTE_GROUPS if node.keys else RECOMPUTE_ONE_ROW
    if isinstance(node, ir.Distinct):
        return DISTINCT_COUNTS
    if isinstance(node, ir.SetOp):
        return TOUCHED_ROWS
    if isinstance(node, ir.Window):
        return TOUCHED_PARTITIONS
    if isinstance(node, ir.TopK):
        return TOPK_DIFFERENCE
    return type(node).__name__


def steps_of(
    tree: ir.Node,
    materialized: Mapping[ir.Node, str],
    *,
    changed: Collection[str] | None = None,
    stored_state: bool = False,
) -> tuple[Step, ...]:
    """Every node of ``tree`` (children first) with its rule and materialization reason."""
    memo: dict[ir.Node, bool] = {}
    return tuple(
        Step(
            node,
            rule_of(
                node,
                changed=changed,
                is_root=node is tree,
                stored_state=stored_state,
                materialized=materialized.keys(),
                _memo=memo,
            ),
            materialized.get(node) if node is not tree else None,
        )
        for node in ir.walk(tree)
    )


class ViewNames:
    """The default :class:`~pgtrickle.dvm.compile.Reads`: one temporary-view name per relation
    (``__pgt_post_<relation>``, ``__pgt_delta_<relation>``, ``__pgt_mat_<i>[_pre]``, with every
    character outside ``[A-Za-z0-9_]`` as ``_`` and a per-relation number), which the caller
    registers from :attr:`Compiled.reads` (each read names the node it holds)."""

    def __init__(self) -> None:
        self._relations: dict[str, int] = {}
        self._hidden: dict[ir.Node, int] = {}

    def _relation(self, kind: str, relation: str) -> str:
        number = self._relations.setdefault(relation, len(self._relations))
        return f"__pgt_{kind}_{number}_{re.sub(r'[^A-Za-z0-9_]', '_', relation)}"[:60]

    def post(self, scan: ir.Scan) -> str:
        return self._relation("post", scan.relation)

    def delta(self, scan: ir.Scan) -> str:
        return self._relation("delta", scan.relation)

    def materialized(self, node: ir.Materialized) -> str:
        number = self._hidden.setdefault(node.node, len(self._hidden))
        return f"__pgt_mat_{number}" + ("_pre" if node.pre else "_change" if node.change else "")


def plan_delta(
    pg_sql: str,
    schema: Mapping[str, Sequence[str]],
    column_types: Mapping[str, Mapping[str, str]] | None,
    changed: Collection[str],
    dialect: Dialect,
    *,
    reads: Reads | None = None,
    stored_state: bool = False,
    keep_state: bool = False,
) -> DeltaPlan:
    """Plan the change of the query ``pg_sql`` (PostgreSQL text, as ``pg_get_viewdef`` gives it)
    over a refresh window in which the relations ``changed`` have pending changes.

    ``schema``: every relation's columns (keys as the query names them); ``column_types``:
    their PostgreSQL types (see :func:`compile_ir`); ``reads``: names the relations the plan
    reads (base relations, change buffers, hidden tables); :class:`ViewNames` by default.
    ``keep_state``: the nodes :func:`~pgtrickle.dvm.materialize.decide` keeps have hidden state
    tables (``refresh/state_tables.py``): the plan reads them as stored and
    :attr:`DeltaPlan.state_changes` says what to apply to each (:mod:`pgtrickle.dvm.integrate`);
    without it such a plan asks for a full refresh.

    Raises:
        UnsupportedQueryError / NoDeltaRuleError: the query cannot be parsed, lowered or planned.
        InvalidPlanError: the plan breaks the IR's contract (a bug, not bad input).
    """
    tree = lower(parse_query(pg_sql), schema)
    if keep_state:
        tree = semijoin_counts.rewrite(tree)
    materialized = materialize.decide(tree)
    if materialized and column_types is not None:
        types = column_types
        tree = kept_state.rewrite(tree, materialized, lambda a: not not_storable(a, types))
        materialized = materialize.decide(tree)
    changed = frozenset(changed)
    resolver = reads or ViewNames()

    def compiled_of(node: ir.Node | None) -> Compiled | None:
        if node is None:
            return None
        return compile_ir(node, resolver, dialect=dialect, column_types=column_types).consolidated()

    state_changes: tuple[tuple[ir.Node, Compiled | None], ...] = ()
    state_plans: tuple[ir.Node | None, ...] = ()
    if keep_state and materialized:
        integrated = integrate(tree, changed, tuple(materialized), stored_state=stored_state)
        plan = integrated.plan
        state_changes = tuple((node, compiled_of(change)) for node, change in integrated.changes)
        state_plans = tuple(change for _, change in integrated.changes)
    else:
        plan = rules.delta(tree, changed, tuple(materialized), stored_state=stored_state)
    steps = steps_of(tree, materialized, changed=changed, stored_state=stored_state)
    return DeltaPlan(tree, steps, materialized, plan, compiled_of(plan), state_changes, state_plans)
