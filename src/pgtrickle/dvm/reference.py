"""The reference evaluator: the value of any IR tree over ``collections.Counter`` Z-sets.

Pure and slow on purpose: it is the *definition* the delta rules are proved against (no JVM,
no database). A Z-set is a ``Counter`` from row tuple (in the order of ``node.columns``) to
integer weight; weights may be negative; a zero weight is the same as an absent row.

The environment gives, per ``Scan.relation``, a :class:`Table`: its columns, its value at the
refresh snapshot (``post``) and its change over the window (``delta``). Every node denotes its
value at ``post``, except:

- ``Delta(scan)``: the scanned relation's change (``delta``), projected like the scan;
- ``Materialized(node, pre)``: ``node``'s own value at ``post``, or at the window's start when
  ``pre`` — every relation then reads ``pre = post − delta`` (see :func:`at_pre`);
  ``Materialized(node, change=True)``: the difference of the two (its change buffer);
- ``Negate(node)``: ``node`` with its weights negated.

Linear operators (``Filter``, ``Project``, ``UnionAll``, inner joins, and the left side of
``SEMI``/``ANTI`` joins) carry weights as relational algebra carries multiplicities (a join
multiplies them). Non-linear ones read their input's *net* weights: a row is present when its
net weight is positive and then occurs that many times (``Aggregate``, ``Distinct``, ``SetOp``,
``Window``, ``TopK``, the right side of ``SEMI``/``ANTI``, and the existence test of an outer
join's padded part). Outer joins are defined as ``inner ⊎ pad(rows of one side that match no
present row of the other)``, keeping the unmatched row's weight; their output is NULL-padded.
Each non-linear operator emits its rows with weight 1 per occurrence.

Scalar semantics (three-valued logic, aggregates, window functions) are in
:mod:`pgtrickle.dvm.reference_scalar`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pgtrickle.dvm import ir
from pgtrickle.dvm.reference_scalar import aggregate, holds, order_key, scalar, window_values
from pgtrickle.errors import UnsupportedQueryError

ZSet = Counter  # Counter[tuple[Any, ...]] of row → weight


@dataclass(frozen=True)
class Table:
    """A base relation in the environment: rows are tuples in the order of ``columns``."""

    columns: tuple[str, ...]
    post: ZSet
    delta: ZSet = field(default_factory=Counter)


Env = Mapping[str, Table]


def consolidate(z: Mapping[tuple[Any, ...], int]) -> ZSet:
    """``z`` without its zero weights (so two Z-sets compare equal by ``==``)."""
    return Counter({row: w for row, w in z.items() if w != 0})


def add(a: Mapping[tuple[Any, ...], int], b: Mapping[tuple[Any, ...], int], sign: int = 1) -> ZSet:
    """``a ⊎ sign·b``, consolidated."""
    out: ZSet = Counter(a)
    for row, w in b.items():
        out[row] += sign * w
    return consolidate(out)


def at_pre(env: Env) -> dict[str, Table]:
    """The environment at the window's start: ``post − delta`` per relation, no change."""
    return {name: Table(t.columns, add(t.post, t.delta, -1)) for name, t in env.items()}


def evaluate(node: ir.Node, env: Env) -> ZSet:
    """The value of ``node`` (consolidated Z-set) in ``env``."""
    return consolidate(_Evaluator(env).value(node))


def _occurrences(z: Mapping[tuple[Any, ...], int]) -> Iterator[tuple[Any, ...]]:
    """Each row present in ``z`` (positive net weight), once per unit of weight."""
    for row, w in z.items():
        for _ in range(max(w, 0)):
            yield row


def _present(z: Mapping[tuple[Any, ...], int]) -> list[tuple[Any, ...]]:
    return [row for row, w in z.items() if w > 0]


class _Evaluator:
    def __init__(self, env: Env) -> None:
        self.env = env
        self.memo: dict[ir.Node, ZSet] = {}  # by identity; holding the node keeps its hash unique
        self._pre: _Evaluator | None = None

    def value(self, node: ir.Node) -> ZSet:
        if node not in self.memo:
            self.memo[node] = consolidate(self._compute(node))
        return self.memo[node]

    def _compute(self, node: ir.Node) -> ZSet:
        handler = _HANDLERS.get(type(node))
        if handler is None:
            raise UnsupportedQueryError(f"the reference evaluator has no rule for {type(node).__name__}")
        return handler(self, node)

    def _table(self, scan: ir.Scan, delta: bool) -> ZSet:
        table = self.env.get(scan.relation)
        if table is None:
            raise UnsupportedQueryError(f"the relation {scan.relation!r} is not in the environment")
        missing = [c for c in scan.source_columns if c not in table.columns]
        if missing:
            raise UnsupportedQueryError(f"the relation {scan.relation!r} has no column(s) {missing}")
        positions = [table.columns.index(c) for c in scan.source_columns]
        out: ZSet = Counter()
        for row, w in (table.delta if delta else table.post).items():
            out[tuple(row[i] for i in positions)] += w
        return out

    def scan(self, node: ir.Scan) -> ZSet:
        return self._table(node, delta=False)

    def delta(self, node: ir.Delta) -> ZSet:
        return self._table(node.scan, delta=True)

    def values(self, node: ir.Values) -> ZSet:
        return Counter(tuple(scalar(e, {}) for e in row) for row in node.rows)

    def filter(self, node: ir.Filter) -> ZSet:
        cols = node.input.columns
        return Counter(
            {
                row: w
                for row, w in self.value(node.input).items()
                if holds(node.predicate, dict(zip(cols, row, strict=True)))
            }
        )

    def project(self, node: ir.Project) -> ZSet:
        cols = node.input.columns
        out: ZSet = Counter()
        for row, w in self.value(node.input).items():
            named = dict(zip(cols, row, strict=True))
            out[tuple(scalar(e, named) for _, e in node.outputs)] += w
        return out

    def union_all(self, node: ir.UnionAll) -> ZSet:
        out: ZSet = Counter()
        for branch in node.branches:
            if len(branch.columns) != len(node.output):
                raise UnsupportedQueryError("UnionAll: a branch's column count differs from the output's")
            for row, w in self.value(branch).items():
                out[row] += w
        return out

    def negate(self, node: ir.Negate) -> ZSet:
        return Counter({row: -w for row, w in self.value(node.input).items()})

    def materialized(self, node: ir.Materialized) -> ZSet:
        if not node.pre and not node.change:
            return self.value(node.node)
        if self._pre is None:
            self._pre = _Evaluator(at_pre(self.env))
        pre = self._pre.value(node.node)
        if not node.change:
            return pre
        out = Counter(self.value(node.node))
        out.subtract(pre)
        return Counter({row: w for row, w in out.items() if w})

    def join(self, node: ir.Join) -> ZSet:
        left, right = self.value(node.left), self.value(node.right)
        lcols, rcols = node.left.columns, node.right.columns
        both = lcols + rcols

        def matches(l_row: tuple[Any, ...], r_row: tuple[Any, ...]) -> bool:
            return holds(node.condition, dict(zip(both, l_row + r_row, strict=True)))

        out: ZSet = Counter()
        kind = node.kind
        if kind in (ir.JoinKind.SEMI, ir.JoinKind.ANTI):
            present = _present(right)
            for l_row, w in left.items():
                found = any(matches(l_row, r_row) for r_row in present)
                if found == (kind is ir.JoinKind.SEMI):
                    out[l_row] += w
            return out
        for l_row, lw in left.items():
            for r_row, rw in right.items():
                if matches(l_row, r_row):
                    out[l_row + r_row] += lw * rw
        if kind in (ir.JoinKind.LEFT, ir.JoinKind.FULL):
            present = _present(right)
            for l_row, w in left.items():
                if not any(matches(l_row, r_row) for r_row in present):
                    out[l_row + (None,) * len(rcols)] += w
        if kind in (ir.JoinKind.RIGHT, ir.JoinKind.FULL):
            present = _present(left)
            for r_row, w in right.items():
                if not any(matches(l_row, r_row) for l_row in present):
                    out[(None,) * len(lcols) + r_row] += w
        return out

    def aggregate(self, node: ir.Aggregate) -> ZSet:
        cols = node.input.columns
        groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for row in _occurrences(self.value(node.input)):
            named = dict(zip(cols, row, strict=True))
            groups.setdefault(tuple(scalar(e, named) for _, e in node.keys), []).append(named)
        if not node.keys and not groups:
            groups[()] = []
        return Counter(
            key + tuple(aggregate(call, rows) for _, call in node.aggregates) for key, rows in groups.items()
        )

    def distinct(self, node: ir.Distinct) -> ZSet:
        return Counter(_present(self.value(node.input)))

    def set_op(self, node: ir.SetOp) -> ZSet:
        left, right = self.value(node.left), self.value(node.right)
        out: ZSet = Counter()
        for row in set(_present(left)) | set(_present(right)):
            cl, cr = max(left[row], 0), max(right[row], 0)
            if node.kind is ir.SetOpKind.INTERSECT:
                out[row] = min(cl, cr) if node.all else int(cl > 0 and cr > 0)
            else:
                out[row] = max(cl - cr, 0) if node.all else int(cl > 0 and cr == 0)
        return out

    def window(self, node: ir.Window) -> ZSet:
        cols = node.input.columns
        rows = list(_occurrences(self.value(node.input)))
        columns = [window_values(f, rows, cols) for _, f in node.functions]
        return Counter(row + tuple(values[i] for values in columns) for i, row in enumerate(rows))

    def top_k(self, node: ir.TopK) -> ZSet:
        rows = sorted(_occurrences(self.value(node.input)), key=order_key(node.order, node.input.columns))
        end = None if node.limit is None else node.offset + node.limit
        return Counter(rows[node.offset : end])


_HANDLERS: dict[type[ir.Node], Any] = {
    ir.Scan: _Evaluator.scan,
    ir.Delta: _Evaluator.delta,
    ir.Values: _Evaluator.values,
    ir.Filter: _Evaluator.filter,
    ir.Project: _Evaluator.project,
    ir.UnionAll: _Evaluator.union_all,
    ir.Negate: _Evaluator.negate,
    ir.Materialized: _Evaluator.materialized,
    ir.Join: _Evaluator.join,
    ir.Aggregate: _Evaluator.aggregate,
    ir.Distinct: _Evaluator.distinct,
    ir.SetOp: _Evaluator.set_op,
    ir.Window: _Evaluator.window,
    ir.TopK: _Evaluator.top_k,
}
