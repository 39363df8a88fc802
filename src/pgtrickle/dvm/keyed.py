"""Key pushdown: which reads of a delta plan only matter for the keys a change touches.

Pure: no I/O. A rule that recomputes "only what changed" restricts ``post``/``pre`` of its input
to the touched keys with a SEMI join on keys taken from a change (``restrict(post, K, exprs)``),
and the telescoping join rule joins a change with ``post`` of the other side on the join keys.
In both cases only the rows of the read whose key column holds a value of the change can reach
the result. :func:`restrictions` finds, for every relation the plans read (a base relation's
``post``, or a hidden table as stored), one such column and the change columns whose values
bound it — when **every** place any of the plans reads it from is bound that way — so the
refresh reads only those rows in PostgreSQL (``col = ANY(keys)``), not the whole table.

The analysis walks the plans top down carrying *demands*: ``(column, sources)`` pairs meaning
"the plan's result is the same for any value of this node that agrees with its true value on
the rows whose ``column`` holds a value (NULL included, null-safely) of one of ``sources``".
Where the keys come from is :mod:`pgtrickle.dvm.keyed_sources` (a column whose every value
comes from change columns, through the operators that keep values). A demand passes:

- through ``Filter``, ``Negate``, ``Distinct``, ``UnionAll`` and set operations (by position),
  a ``Project`` column that is a plain column, an ``Aggregate`` group key that is a plain column
  (a group is computed from its own rows), a ``Window`` column every function partitions by;
- into a join: to the side holding the column, and across an equality ``a = b`` (or ``IS NOT
  DISTINCT FROM``) of the condition to the other side's column, since every row of the other
  side that meets a row of this side matches it on that column. It crosses into the right side
  of INNER, SEMI, ANTI and LEFT joins (an existence test or a padding looks only at the rows
  matching the left row), into the left side of INNER and RIGHT joins. A demand on a column the
  outer join pads with NULLs is dropped, and a FULL join drops them all;
- a join also *creates* demands: on the right side of INNER, SEMI, ANTI and LEFT joins, and on
  the left of INNER and RIGHT joins (and SEMI, whose rows are those that match), for each
  equality whose other column comes from a change.

A join whose condition holds two or more plain ``a = b`` equalities between its sides also
creates a *composite* demand: on the tuple of this side's columns, bounded by the tuples the
other side's columns hold together (:meth:`~pgtrickle.dvm.keyed_sources.Sources.pairs_of`).
A composite demand passes where each of its columns would (but not across an equality, and
not into a hidden table's read), and a read bounded by one keeps only the rows whose columns
hold one of those tuples — none holding a NULL, which no ``=`` meets. TPC-H Q9's
part-suppliers are read by the (part, supplier) pairs of the changed lines, not by all the
suppliers of their parts.

Everything else (TopK, a window without a common partition, an outer join's padded column)
drops the demands: its input is read whole. Each read gets, per use, the demands reaching it;
a column demanded by every use is bounded by the union of those uses' sources (a use bounded by
fewer keys is also bounded by more). A base relation no one column bounds is bounded by the OR
of each use's own column (TPC-H Q9's lines: by the changed orders' keys for one term, by the
changed part-suppliers' parts for another).

A restriction is a superset filter: the caller may also keep rows whose column is NULL (a NULL
key is a group, and ``IS NOT DISTINCT FROM`` matches it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from pgtrickle.dvm import ir
from pgtrickle.dvm.keyed_sources import (
    Bounds,
    Column,
    KeySource,
    Sources,
    columns_of,
    equalities,
    label,
    plain,
    strict_equalities,
    window_partition,
)

__all__ = ["KeySource", "Restriction", "restrictions"]


@dataclass(frozen=True, order=True)
class Restriction:
    """Read only the rows whose ``column`` holds a value of one of ``keys`` (sorted, at least one).
    ``column`` is a source column for a base relation's read, a column of the node for a hidden
    table's read.

    ``alternatives``: the other columns every use bounds, each with its keys (the fewest sources
    first). Any one of them bounds the read as well; which selects the fewest rows depends on the
    keys' count and the column's statistics, which the reader knows (refresh/delta_reads.py)."""

    column: Column
    keys: tuple[KeySource, ...]
    alternatives: tuple[tuple[Column, tuple[KeySource, ...]], ...] = field(default=(), compare=False)
    others: tuple[tuple[Column, tuple[KeySource, ...]], ...] = ()
    """Further ``(column, keys)`` bounds OR-ed with this one (a base relation's read only): no one
    column bounds every use, but every use is bounded by one of these columns, so the rows
    holding a key in any of them are all the uses need."""

    def candidates(self) -> tuple[Restriction, ...]:
        """This bound and each alternative, as restrictions of their own (this one first)."""
        return (self, *(Restriction(column, keys) for column, keys in self.alternatives))

    def parts(self) -> tuple[tuple[Column, tuple[KeySource, ...]], ...]:
        """Every ``(column, keys)`` OR-ed: this bound's own, then :attr:`others`."""
        return ((self.column, self.keys), *self.others)


Demand = frozenset[tuple[Column, frozenset[KeySource]]]
ReadKey = tuple[str, object]
"""``("post", relation)`` or ``("materialized", node)``."""

_EMPTY: Demand = frozenset()
_MATCHED_LEFT = (ir.JoinKind.INNER, ir.JoinKind.SEMI, ir.JoinKind.RIGHT)
"""Joins whose left rows that matter are those meeting a right row (or padded, for RIGHT)."""
_MATCHED_RIGHT = (ir.JoinKind.INNER, ir.JoinKind.SEMI, ir.JoinKind.ANTI, ir.JoinKind.LEFT)


def _mapped(column: Column, mapping: Mapping[str, str | None]) -> Column | None:
    """``column`` (or each part of a composite one) through ``mapping``; ``None`` when a part has
    no image."""
    parts = tuple(mapping.get(c) for c in columns_of(column))
    if any(p is None for p in parts):
        return None
    names = tuple(p for p in parts if p is not None)
    return names[0] if isinstance(column, str) else names


def _within(column: Column, columns: AbstractSet[str]) -> bool:
    return set(columns_of(column)) <= columns


class _Walk:
    def __init__(self) -> None:
        self.uses: dict[ReadKey, list[Demand]] = {}
        self._seen: set[tuple[int, Demand]] = set()
        self._sources = Sources()

    def visit(self, node: ir.Node, demand: Demand) -> None:
        if (id(node), demand) in self._seen:
            return
        self._seen.add((id(node), demand))
        if isinstance(node, ir.Scan):
            to_source: dict[str, str | None] = dict(zip(node.output, node.source_columns, strict=True))
            self._use(("post", node.relation), self._map(demand, to_source))
        elif isinstance(node, ir.Materialized):
            if not node.change:  # a change is read whole (it is the change); by one column only
                self._use(
                    ("materialized", node.node), frozenset((c, k) for c, k in demand if isinstance(c, str))
                )
        elif isinstance(node, (ir.Filter, ir.Negate, ir.Distinct)):
            self.visit(node.input, demand)
        elif isinstance(node, (ir.Project, ir.Aggregate)):
            named = dict(node.outputs if isinstance(node, ir.Project) else node.keys)
            self.visit(node.input, self._map(demand, {c: plain(e) for c, e in named.items()}))
        elif isinstance(node, ir.Window):
            partition = window_partition(node)
            self.visit(node.input, frozenset((c, k) for c, k in demand if _within(c, partition)))
        elif isinstance(node, (ir.UnionAll, ir.SetOp)):
            for branch in node.inputs:
                mapping: dict[str, str | None] = dict(zip(node.columns, branch.columns, strict=True))
                self.visit(branch, self._map(demand, mapping))
        elif isinstance(node, ir.Join):
            self._join(node, demand)
        else:
            for child in node.inputs:
                self.visit(child, _EMPTY)

    @staticmethod
    def _map(demand: Demand, mapping: Mapping[str, str | None]) -> Demand:
        """``demand`` on the columns ``mapping`` renames them to (the others dropped)."""
        return frozenset((m, k) for c, k in demand if (m := _mapped(c, mapping)) is not None)

    def _join(self, node: ir.Join, demand: Demand) -> None:
        kind = node.kind
        if kind is ir.JoinKind.FULL:
            for child in node.inputs:
                self.visit(child, _EMPTY)
            return
        lcols, rcols = set(node.left.columns), set(node.right.columns)
        # A demand on a column the join pads with NULLs says nothing of the padded side's rows.
        above_left = {(c, k) for c, k in demand if _within(c, lcols) and kind is not ir.JoinKind.RIGHT}
        above_right = {
            (c, k) for c, k in demand if _within(c, rcols) and kind in (ir.JoinKind.INNER, ir.JoinKind.RIGHT)
        }
        left, right = set(above_left), set(above_right)
        pairs = [
            (a, b) if a in lcols else (b, a)
            for a, b in strict_equalities(node.condition)
            if (a in lcols and b in rcols) or (b in lcols and a in rcols)
        ]
        if len(pairs) > 1:
            lkey, rkey = tuple(a for a, _ in pairs), tuple(b for _, b in pairs)
            if kind in _MATCHED_RIGHT:
                found = self._sources.pairs_of(node.left, lkey, _change_bounds(above_left))
                if found is not None:
                    right.add((rkey, found))
            if kind in _MATCHED_LEFT:
                found = self._sources.pairs_of(node.right, rkey, _change_bounds(above_right))
                if found is not None:
                    left.add((lkey, found))
        for a, b in equalities(node.condition):
            for mine, other in ((a, b), (b, a)):
                if mine in rcols and other in lcols and kind in _MATCHED_RIGHT:
                    right |= self._across(node.left, other, mine, above_left)
                if mine in lcols and other in rcols and kind in _MATCHED_LEFT:
                    left |= self._across(node.right, other, mine, above_right)
        self.visit(node.left, frozenset(left))
        self.visit(node.right, frozenset(right))

    def _across(
        self, side: ir.Node, column: str, mine: str, demanded: Iterable[tuple[Column, frozenset[KeySource]]]
    ) -> set[tuple[Column, frozenset[KeySource]]]:
        """Demands on ``mine``, the other side's column of an equality with ``column`` of
        ``side``: ``column``'s own change sources, and each demand on ``column`` from above.
        The demands from above that are change keys alone bound the rows of ``side`` that
        matter, so a source derived from ``side``'s rows carries them (``KeySource.via``)."""
        demanded = list(demanded)
        out: set[tuple[Column, frozenset[KeySource]]] = {(mine, k) for c, k in demanded if c == column}
        found = self._sources.of(side, column, _change_bounds(demanded))
        if found is not None:
            out.add((mine, found))
        return out

    def _use(self, key: ReadKey, demand: Demand) -> None:
        self.uses.setdefault(key, []).append(demand)


def _change_bounds(demanded: Iterable[tuple[Column, frozenset[KeySource]]]) -> Bounds:
    """The demands from above that are change keys alone, on one column each: they bound the rows
    of the side they reach, so a source derived from that side's rows carries them (``via``)."""
    return frozenset((c, k) for c, k in demanded if isinstance(c, str) and not _derived(k))


def _derived(keys: Iterable[KeySource]) -> int:
    return sum(k.derived for k in keys)


def _waiting(keys: Iterable[KeySource]) -> int:
    return sum(k.waits for k in keys)


Rank = tuple[int, int, int, int, str, list[KeySource]]


def _rank(column: Column, keys: AbstractSet[KeySource]) -> Rank:
    """Which of a use's bounding columns to prefer: change keys before derived ones, and derived
    ones with their own bounds (``via``) before those waiting for another read's bound (the first
    dropped), then composite keys of the most columns (their tuples select no more rows than any
    one of their columns' values), then the fewest sources."""
    return (_waiting(keys), _derived(keys), -len(columns_of(column)), len(keys), label(column), sorted(keys))


def _disjunction(demands: list[Demand]) -> Restriction | None:
    """When every use demands some column: each use's own best column (:func:`_rank`), the
    sources of the uses choosing one column merged, OR-ed. Never a composite key: PostgreSQL
    combines the indexes of OR-ed ``col = ANY(keys)`` tests, but a row tested ``IN`` a subquery
    under an OR is a filter over every row (TPC-H Q9's lines, OR-ed with a pair of changed
    part-suppliers: all 6M read in 1.6 s, against 0.08 s by the part alone)."""
    chosen: dict[str, frozenset[KeySource]] = {}
    for use in demands:
        d = {(c, k) for c, k in use if isinstance(c, str)}
        if not d:
            return None
        column, keys = min(d, key=lambda ck: _rank(*ck))
        chosen[column] = chosen.get(column, frozenset()) | keys
    (first, keys), *others = sorted(chosen.items())
    return Restriction(first, tuple(sorted(keys)), (), tuple((c, tuple(sorted(k))) for c, k in others))


def _bound(demands: list[Demand], disjunctive: bool = False) -> Restriction | None:
    """The columns every use demands, each with the union of the uses' sources: the best one
    (:func:`_rank`), the others bounded by changes' keys as its alternatives. With none and
    ``disjunctive``: the :func:`_disjunction` of the uses' own columns, if every use has one."""
    found: list[tuple[Rank, Column, tuple[KeySource, ...]]] = []
    columns = set.intersection(*({c for c, _ in d} for d in demands)) if demands else set()
    for column in sorted(columns, key=label):
        union: frozenset[KeySource] = frozenset()
        for d in demands:
            options = [k for c, k in d if c == column]
            union |= min(options, key=lambda k: _rank(column, k))
        found.append((_rank(column, union), column, tuple(sorted(union))))
    if not found:
        return _disjunction(demands) if disjunctive and demands else None
    found.sort(key=lambda f: f[0])
    (_, column, keys), *others = found
    # An alternative is chosen by its keys' count (refresh/key_bounds.narrowest), which a
    # derived bound has not before its read runs: only change-keyed ones are offered.
    offered = tuple((c, k) for _, c, k in others if not _derived(k))
    return Restriction(column, keys, offered)


def _usable(demand: Demand, bounded: Mapping[ReadKey, Restriction]) -> Demand:
    """The pairs of ``demand`` whose derived sources waiting for a read's bound (if any) name
    reads already bounded (one with its own bounds, ``via``, waits for none)."""
    return frozenset(
        (c, k) for c, k in demand if all(not s.waits or ("post", s.relation) in bounded for s in k)
    )


def restrictions(*plans: ir.Node | None) -> dict[ReadKey, Restriction]:
    """For each read of ``plans`` (read through the same views) that every use bounds by a
    change's keys, one such bound (reads read whole are absent). Keys: ``("post", relation)``,
    ``("materialized", node)``.

    Derived sources (``KeySource.derived``) are admitted in rounds: first the reads bounded by
    changes' keys alone (and derived sources with their own bounds, ``via``: the rows of their
    relation meeting change keys), then the reads bounded with derived sources naming reads
    bounded in an earlier round, until no more read is bounded. So a derived bound always names
    a bounded read or its own change-keyed rows, and no read depends on its own rows, directly
    or through others."""
    walk = _Walk()
    for plan in plans:
        if plan is not None:
            walk.visit(plan, _EMPTY)
    out: dict[ReadKey, Restriction] = {}
    while True:
        found = {}
        for key, demands in walk.uses.items():
            if key in out:
                continue
            bound = _bound([_usable(d, out) for d in demands], disjunctive=key[0] == "post")
            if bound is not None:
                found[key] = bound
        if not found:
            return out
        out.update(found)
