"""Aggregate (GROUP BY keys, or none): recompute the touched groups, or, for invertible
aggregates over a stored state, add the aggregate of the change to it.

**Recompute** (every aggregate; MIN/MAX and DISTINCT aggregates need it). The touched groups are
``K`` = the distinct group keys of the rows the input's change touches (an update inside a group
touches it though its net count does not move). A group outside ``K`` has the same rows before
and after, so::

    Δ Agg(X) = −Agg(pre X ⋉ K) ⊎ Agg(post X ⋉ K)

where ``⋉`` is a SEMI join on the group key expressions with ``IS NOT DISTINCT FROM`` (a NULL
key is a group). Without GROUP BY there is exactly one row before and after:
``−Agg(pre X) ⊎ Agg(post X)``.

**Algebraic** (COUNT, SUM, AVG without DISTINCT, FILTER allowed). The stored value is the
*state* (:func:`state_node`): the visible columns with each SUM's non-NULL count, each AVG as a
sum and a count, and a hidden row count ``__pgt_count`` — so a group whose count drops to 0
disappears, and a SUM over no non-NULL value is NULL, not 0. Every state column is an additive
count or sum, so::

    new state(g) = old state(g) + Σ over ΔX⁺ − Σ over ΔX⁻

where ``ΔX⁺``/``ΔX⁻`` are the rows the change inserts/deletes (an aggregate reads net weights,
so ``Agg(ΔX)`` and ``Agg(−ΔX)`` are those sums). The old state of the touched groups is
``Materialized(state, pre=True) ⋉ K``; ``Δ state = −old ⊎ new (count > 0)``, and the visible
change is its projection (``AVG = CAST(sum AS NUMERIC) / count``).

**Kept** (an aggregate kept in a hidden state table, :mod:`pgtrickle.dvm.materialize`, seen
through ``Filter``/``Project`` nodes that carry every group key as a column). The table holds
the kept node's value at the window's start, so the old rows of the touched groups are read
from it instead of being aggregated again from the input's ``pre`` (``post ⊎ −Δ``, which
repeats the input's change plan inside the plan)::

    Δ M = −(stored(M) ⋉ K) ⊎ chain(Agg(post X ⋉ K))

where ``chain`` re-applies the ``Filter``/``Project`` nodes between ``M`` and the aggregate
(linear, so they commute with the restriction to whole groups).
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass

from sqlglot import exp

from pgtrickle.dvm import ir
from pgtrickle.dvm.rules.common import Context, col, minus, null_safe_match, restrict, touched_keys

ROW_COUNT = "__pgt_count"
"""The state's hidden row count of a group."""

# An aggregate → its state node (held weakly: a plan holds the state it reads) and a state node →
# its aggregate (held strongly, for as long as the state node lives). No cycle keeps either alive.
_STATES: weakref.WeakKeyDictionary[ir.Aggregate, weakref.ref[ir.Aggregate]] = weakref.WeakKeyDictionary()
_ORIGINALS: weakref.WeakKeyDictionary[ir.Aggregate, ir.Aggregate] = weakref.WeakKeyDictionary()


def _calls_only(node: ir.Aggregate, functions: tuple[type[exp.Expr], ...]) -> bool:
    """Whether every aggregate of ``node`` calls one of ``functions``, without DISTINCT."""
    for _, call in node.aggregates:
        inner, _, distinct, _ = ir.split_aggregate(call)
        if distinct or not isinstance(inner, functions):
            return False
    return True


def invertible(node: ir.Aggregate) -> bool:
    """Whether every aggregate is COUNT, SUM or AVG without DISTINCT (FILTER allowed)."""
    return _calls_only(node, (exp.Count, exp.Sum, exp.Avg))


def additive(node: ir.Aggregate) -> bool:
    """Whether every aggregate is COUNT or SUM without DISTINCT (FILTER allowed): the state is
    the visible columns plus counts, so its visible rows are a projection of it (no quotient)."""
    return _calls_only(node, (exp.Count, exp.Sum))


def _with(call: exp.Expr, new: exp.Expr) -> exp.Expr:
    """``new`` under ``call``'s FILTER, if it has one."""
    if isinstance(call, exp.Filter):
        return exp.Filter(this=new, expression=call.expression.copy())
    return new


def _state_columns(node: ir.Aggregate) -> tuple[tuple[str, exp.Expr], ...]:
    out: list[tuple[str, exp.Expr]] = []
    for name, call in node.aggregates:
        inner, argument, _, _ = ir.split_aggregate(call)
        if isinstance(inner, exp.Count):
            out.append((name, call))
            continue
        assert argument is not None
        count = _with(call, exp.Count(this=argument.copy()))
        if isinstance(inner, exp.Sum):
            out += [(name, call), (f"__pgt_n_{name}", count)]
        else:
            out += [
                (f"__pgt_s_{name}", _with(call, exp.Sum(this=argument.copy()))),
                (f"__pgt_n_{name}", count),
            ]
    out.append((ROW_COUNT, exp.Count(this=exp.Star())))
    return tuple(out)


def sum_counts(node: ir.Aggregate) -> dict[str, str]:
    """Each SUM column of the state → the column counting its non-NULL values."""
    out: dict[str, str] = {}
    for name, call in node.aggregates:
        inner = ir.split_aggregate(call)[0]
        if isinstance(inner, exp.Sum):
            out[name] = f"__pgt_n_{name}"
        elif isinstance(inner, exp.Avg):
            out[f"__pgt_s_{name}"] = f"__pgt_n_{name}"
    return out


def state_node(node: ir.Aggregate) -> ir.Aggregate:
    """The stored state of an invertible aggregate (the same object for the same node, while
    anything holds it)."""
    held = _STATES.get(node)
    state = None if held is None else held()
    if state is None:
        state = ir.Aggregate(node.input, node.keys, _state_columns(node))
        _STATES[node] = weakref.ref(state)
        _ORIGINALS[state] = node
    return state


def original_of(state: ir.Node) -> ir.Aggregate | None:
    """The aggregate whose :func:`state_node` ``state`` is (``None``: it is no state node)."""
    return _ORIGINALS.get(state) if isinstance(state, ir.Aggregate) else None


def visible(node: ir.Aggregate, state_rows: ir.Node) -> ir.Node:
    """Rows of the state projected onto the aggregate's own columns."""
    outputs: list[tuple[str, exp.Expr]] = [(k, col(k)) for k, _ in node.keys]
    for name, call in node.aggregates:
        inner = ir.split_aggregate(call)[0]
        if isinstance(inner, exp.Avg):
            n = col(f"__pgt_n_{name}")
            quotient = exp.Div(this=exp.cast(col(f"__pgt_s_{name}"), exp.DType.DECIMAL), expression=n)
            positive = exp.GT(this=n.copy(), expression=exp.Literal.number(0))
            outputs.append((name, exp.Case(ifs=[exp.If(this=positive, true=quotient)])))
        else:
            outputs.append((name, col(name)))
    return ir.Project(state_rows, tuple(outputs))


def recompute(node: ir.Aggregate, ctx: Context) -> ir.Node | None:
    change = ctx.delta(node.input)
    if change is None:
        return None
    pre, post = ctx.pre(node.input), ctx.post(node.input)
    if node.keys:
        exprs = [e for _, e in node.keys]
        keys = touched_keys(change, exprs, node.input.columns)
        pre, post = restrict(pre, keys, exprs), restrict(post, keys, exprs)
    return minus(
        ir.Aggregate(post, node.keys, node.aggregates),
        ir.Aggregate(pre, node.keys, node.aggregates),
        node.columns,
    )


def delta_state(node: ir.Aggregate, ctx: Context) -> ir.Node | None:
    """The change of :func:`state_node` (its columns), by the algebraic form."""
    change = ctx.delta(node.input)
    if change is None:
        return None
    state = state_node(node)
    key_names = [k for k, _ in node.keys]
    components = [(name, call) for name, call in state.aggregates]
    old: ir.Node = ir.Materialized(state, pre=True)
    if node.keys:
        exprs = [e for _, e in node.keys]
        keys = touched_keys(change, exprs, [*node.input.columns, *state.columns])
        old = ir.Join(ir.JoinKind.SEMI, old, keys, null_safe_match([col(k) for k in key_names], keys.columns))

    def contribution(rows: ir.Node, sign: int) -> ir.Node:
        values = []
        for name, _ in components:
            value: exp.Expr = exp.Coalesce(this=col(name), expressions=[exp.Literal.number(0)])
            values.append((name, exp.Neg(this=exp.Paren(this=value)) if sign < 0 else value))
        return ir.Project(rows, tuple((k, col(k)) for k in key_names) + tuple(values))

    plus = ir.Aggregate(change, node.keys, tuple(components))
    less = ir.Aggregate(ir.Negate(change), node.keys, tuple(components))
    summed = ir.Aggregate(
        ir.UnionAll((contribution(old, 1), contribution(plus, 1), contribution(less, -1)), state.columns),
        tuple((k, col(k)) for k in key_names),
        tuple((name, exp.Sum(this=col(name))) for name, _ in components),
    )
    counts = sum_counts(node)
    fixed: list[tuple[str, exp.Expr]] = [(k, col(k)) for k in key_names]
    for name, _ in components:
        if name in counts:
            positive = exp.GT(this=col(counts[name]), expression=exp.Literal.number(0))
            fixed.append((name, exp.Case(ifs=[exp.If(this=positive, true=col(name))])))
        else:
            fixed.append((name, col(name)))
    new: ir.Node = ir.Project(summed, tuple(fixed))
    if node.keys:
        new = ir.Filter(new, exp.GT(this=col(ROW_COUNT), expression=exp.Literal.number(0)))
    return minus(new, old, state.columns)


def algebraic(node: ir.Aggregate, ctx: Context) -> ir.Node | None:
    """The visible change by the algebraic form (``node`` must be :func:`invertible`)."""
    change = delta_state(node, ctx)
    return None if change is None else visible(node, change)


def delta(node: ir.Aggregate, ctx: Context) -> ir.Node | None:
    return recompute(node, ctx)


@dataclass(frozen=True)
class KeptAggregate:
    """A kept node that is an aggregate seen through ``chain`` (its ``Filter``/``Project``
    nodes, the kept node first), with the kept node's column carrying each group key."""

    aggregate: ir.Aggregate
    chain: tuple[ir.Filter | ir.Project, ...]
    key_columns: tuple[str, ...]


def kept_aggregate(node: ir.Node) -> KeptAggregate | None:
    """``node`` as a :class:`KeptAggregate`, or ``None`` when no aggregate lies under it
    through ``Filter``/``Project`` nodes or one of its group keys is not a column of ``node``."""
    chain: list[ir.Filter | ir.Project] = []
    current = node
    while isinstance(current, (ir.Filter, ir.Project)):
        chain.append(current)
        current = current.input
    if not isinstance(current, ir.Aggregate):
        return None
    carried = [name for name, _ in current.keys]
    for link in reversed(chain):
        if isinstance(link, ir.Project):
            renamed = {
                expression.name: name
                for name, expression in link.outputs
                if isinstance(expression, exp.Column) and not expression.table
            }
            if any(c not in renamed for c in carried):
                return None
            carried = [renamed[c] for c in carried]
    return KeptAggregate(current, tuple(chain), tuple(carried))


def recompute_kept(node: ir.Node, found: KeptAggregate, ctx: Context) -> ir.Node | None:
    """The change of the kept ``node`` (see the module docstring, **Kept**)."""
    inner = found.aggregate
    change = ctx.delta(inner.input)
    if change is None:
        return None
    post = ctx.post(inner.input)
    old: ir.Node = ir.Materialized(node, pre=True)
    if inner.keys:
        exprs = [e for _, e in inner.keys]
        keys = touched_keys(change, exprs, [*inner.input.columns, *node.columns])
        post = restrict(post, keys, exprs)
        old = restrict(old, keys, [col(c) for c in found.key_columns])
    new: ir.Node = ir.Aggregate(post, inner.keys, inner.aggregates)
    for link in reversed(found.chain):
        new = dataclasses.replace(link, input=new)
    return minus(new, old, node.columns)
