"""The operator IR differential refresh works on: a tree of relational operators over Z-sets.

Pure: no I/O. :mod:`pgtrickle.dvm.lower` builds it from a parsed defining
query; the delta rules (:mod:`pgtrickle.dvm.rules`) map each node to the
plan of its change; :mod:`pgtrickle.dvm.reference` evaluates any tree over
``collections.Counter`` Z-sets so the rules can be proved without a JVM or
a database.

Semantics
---------
Every node denotes a **Z-set**: a multiset of rows (tuples, in the order of
``node.columns``) with integer weights. A table read is a Z-set with
weights >= 1; a change is a Z-set with any weights (INSERT +1, DELETE -1,
UPDATE -old +new). Operators act on weights as relational algebra acts on
multiplicities: ``Filter`` and ``Project`` keep a row's weight, ``UnionAll``
adds weights, ``Join`` multiplies the weights of the rows it pairs,
``Negate`` flips signs. Non-linear operators (``Aggregate``, ``Distinct``,
``SetOp``, ``Window``, ``TopK``, and the existence test of ``SEMI``/``ANTI``
joins) read their input's *net* weights: a row is present when its net
weight is positive, and occurs that many times.

Columns
-------
``node.columns`` names a node's output columns, in order; names are unique
within a node's output, and a join's two inputs have disjoint names (the
lowering chooses them). Every expression a node holds (a predicate, a
projection, a group key, an aggregate call, a window function, a sort key)
is a sqlglot expression whose ``exp.Column`` references are unqualified
names of its input's columns (for a join condition: of either input).

Helpers
-------
:func:`walk` and :func:`scans` visit a tree; :func:`split_aggregate` takes an aggregate call
(``COUNT``/``SUM``/``AVG``/``MIN``/``MAX``, with ``DISTINCT`` and ``FILTER``) apart for the
rules and the evaluator.

Identity
--------
Nodes are frozen and compare by identity (``eq=False``): a subtree the
lowering shares between two consumers is one object, and the rules and the
compiler may memoize per node.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum

from sqlglot import exp

from pgtrickle.errors import UnsupportedQueryError

WEIGHT = "__pgt_w"
"""The weight column of a Z-set relation (BIGINT)."""

Named = tuple[tuple[str, exp.Expr], ...]
"""Named expressions: ``((output name, expression over the input's columns), ...)``."""


class JoinKind(StrEnum):
    INNER = "inner"
    LEFT = "left"
    RIGHT = "right"
    FULL = "full"
    SEMI = "semi"
    """Rows of the left input that match at least one row of the right (EXISTS, IN)."""
    ANTI = "anti"
    """Rows of the left input that match no row of the right (NOT EXISTS; NOT IN lowers to an
    ANTI join whose condition is ``(l = r) IS NOT FALSE``, which gives NOT IN's NULL rules)."""


class SetOpKind(StrEnum):
    INTERSECT = "intersect"
    EXCEPT = "except"


@dataclass(frozen=True, eq=False)
class Node:
    """Base of every operator. ``columns`` is the output; ``inputs`` the operand nodes, in order."""

    @property
    def columns(self) -> tuple[str, ...]:
        raise NotImplementedError

    @property
    def inputs(self) -> tuple[Node, ...]:
        return ()


@dataclass(frozen=True, eq=False)
class Scan(Node):
    """A base relation (a source table, or a stream table) read at the refresh snapshot.

    ``relation`` is the catalog's key of the source (schema-qualified name as the
    catalog resolves it from the OID); ``source_columns`` the table's columns read,
    ``output`` the names they take in the tree (parallel tuples).
    """

    relation: str
    source_columns: tuple[str, ...]
    output: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.source_columns) != len(self.output):
            raise ValueError("Scan: source_columns and output differ in length")

    @property
    def columns(self) -> tuple[str, ...]:
        return self.output


@dataclass(frozen=True, eq=False)
class Values(Node):
    """A constant relation (a FROM-less SELECT): never changes."""

    rows: tuple[tuple[exp.Expr, ...], ...]
    output: tuple[str, ...]

    @property
    def columns(self) -> tuple[str, ...]:
        return self.output


@dataclass(frozen=True, eq=False)
class Filter(Node):
    input: Node
    predicate: exp.Expr

    @property
    def columns(self) -> tuple[str, ...]:
        return self.input.columns

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.input,)


@dataclass(frozen=True, eq=False)
class Project(Node):
    input: Node
    outputs: Named

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.outputs)

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.input,)


@dataclass(frozen=True, eq=False)
class UnionAll(Node):
    """Adds its inputs' weights; inputs are matched by position and renamed to ``output``."""

    branches: tuple[Node, ...]
    output: tuple[str, ...]

    @property
    def columns(self) -> tuple[str, ...]:
        return self.output

    @property
    def inputs(self) -> tuple[Node, ...]:
        return self.branches


@dataclass(frozen=True, eq=False)
class Join(Node):
    """A join of any kind over any predicate (``None``: a cross join; only for INNER).

    Output: ``left.columns + right.columns`` (outer joins pad the missing side with NULLs);
    ``left.columns`` alone for SEMI and ANTI.
    """

    kind: JoinKind
    left: Node
    right: Node
    condition: exp.Expr | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        if self.kind in (JoinKind.SEMI, JoinKind.ANTI):
            return self.left.columns
        return self.left.columns + self.right.columns

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.left, self.right)


@dataclass(frozen=True, eq=False)
class Aggregate(Node):
    """GROUP BY ``keys`` computing ``aggregates`` (each one aggregate call, with its DISTINCT or
    FILTER, over the input's columns). With no keys it returns exactly one row, also over an
    empty input. HAVING is a ``Filter`` above it; expressions over aggregates a ``Project``."""

    input: Node
    keys: Named
    aggregates: Named

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.keys) + tuple(name for name, _ in self.aggregates)

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.input,)


@dataclass(frozen=True, eq=False)
class Distinct(Node):
    """Each row present in the input once (SELECT DISTINCT; UNION is ``Distinct(UnionAll)``)."""

    input: Node

    @property
    def columns(self) -> tuple[str, ...]:
        return self.input.columns

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.input,)


@dataclass(frozen=True, eq=False)
class SetOp(Node):
    """INTERSECT / EXCEPT, with or without ALL, matched by position, named ``output``."""

    kind: SetOpKind
    all: bool
    left: Node
    right: Node
    output: tuple[str, ...]

    @property
    def columns(self) -> tuple[str, ...]:
        return self.output

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.left, self.right)


@dataclass(frozen=True, eq=False)
class Window(Node):
    """Adds one column per window function (an ``exp.Window`` over the input's columns)."""

    input: Node
    functions: Named

    @property
    def columns(self) -> tuple[str, ...]:
        return self.input.columns + tuple(name for name, _ in self.functions)

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.input,)


@dataclass(frozen=True, eq=False)
class TopK(Node):
    """ORDER BY ``order`` (``exp.Ordered`` over the input's columns) OFFSET ``offset`` LIMIT ``limit``.

    Ties at the boundary are broken by the whole row (ascending), so the result is a function
    of the input; the defining query's own tie order is unspecified in PostgreSQL too.
    """

    input: Node
    order: tuple[exp.Ordered, ...]
    limit: int | None
    offset: int = 0

    @property
    def columns(self) -> tuple[str, ...]:
        return self.input.columns

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.input,)


# --- Nodes that appear only in delta plans (the rules' output) -------------------------------


@dataclass(frozen=True, eq=False)
class Delta(Node):
    """The change of a base relation over the refresh window (its change buffer, as a Z-set)."""

    scan: Scan

    @property
    def columns(self) -> tuple[str, ...]:
        return self.scan.columns


@dataclass(frozen=True, eq=False)
class Negate(Node):
    """Its input with every weight negated."""

    input: Node

    @property
    def columns(self) -> tuple[str, ...]:
        return self.input.columns

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.input,)


@dataclass(frozen=True, eq=False)
class Materialized(Node):
    """A node whose value is kept in a hidden internal stream table (its own change buffer and
    frontier), read instead of being derived from its inputs. ``pre`` selects the value at the
    window's start (the stored state), else its value at the refresh snapshot; ``change``
    selects its change over the window (a Z-set read with its weights: the hidden table's
    change buffer, computed before anything reads it)."""

    node: Node
    pre: bool = False
    name: str = field(default="")
    change: bool = False

    def __post_init__(self) -> None:
        if self.pre and self.change:
            raise ValueError(
                "Materialized: a read is of the value at the window's start or of the change, not both"
            )

    @property
    def columns(self) -> tuple[str, ...]:
        return self.node.columns


def walk(node: Node) -> Iterator[Node]:
    """Every node of the tree once (shared subtrees once), children before parents."""
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(node, False)]
    while stack:
        current, expanded = stack.pop()
        if id(current) in seen:
            continue
        if expanded:
            seen.add(id(current))
            yield current
            continue
        stack.append((current, True))
        for child in reversed(current.inputs):
            if id(child) not in seen:
                stack.append((child, False))


def scans(node: Node) -> list[Scan]:
    """The base relations a tree reads, each once, in tree order."""
    return [n for n in walk(node) if isinstance(n, Scan)]


AGGREGATE_FUNCTIONS = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)
"""The aggregate functions an ``Aggregate`` node (and a window's aggregate) may call."""


def split_aggregate(call: exp.Expr) -> tuple[exp.Expr, exp.Expr | None, bool, exp.Expr | None]:
    """``(function call, argument or None for COUNT(*), DISTINCT?, FILTER predicate or None)``
    of an aggregate call; :class:`UnsupportedQueryError` naming it if it is none of
    :data:`AGGREGATE_FUNCTIONS` over one argument (or ``COUNT(*)``)."""
    where: exp.Expr | None = None
    function = call
    if isinstance(function, exp.Filter):
        clause = function.expression
        where = clause.this if isinstance(clause, exp.Where) else clause
        function = function.this
    if not isinstance(function, AGGREGATE_FUNCTIONS):
        raise UnsupportedQueryError(f"unsupported aggregate {call.sql()!r}")
    argument = function.this
    distinct = False
    if isinstance(argument, exp.Distinct):
        if len(argument.expressions) != 1:
            raise UnsupportedQueryError(f"unsupported aggregate {call.sql()!r}: DISTINCT over several values")
        distinct, argument = True, argument.expressions[0]
    if isinstance(argument, exp.Star):
        if not isinstance(function, exp.Count) or distinct:
            raise UnsupportedQueryError(f"unsupported aggregate {call.sql()!r}")
        argument = None
    return function, argument, distinct, where
