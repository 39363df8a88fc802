"""What a compilation of the operator IR gives its caller: the query and the relations it reads.

Pure. :mod:`pgtrickle.dvm.compile` folds an IR tree into one query (:class:`Compiled`); the
caller names the relations it reads through :class:`Reads` and registers each :class:`Read` once.

Reads
-----
Every relation the query reads is listed once in :attr:`Compiled.reads`, keyed by the name
the resolver gave (two ``Scan`` or ``Delta`` nodes resolved to one name are one read), with
the number of places it is read from (``uses``), so the caller registers each once and
persists the ones read more than once (docs/DELTA_COMPILER.md, "Reads").
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from sqlglot import exp
from sqlglot.errors import ErrorLevel, SqlglotError

from pgtrickle.dvm.compile_sql import Dialect, consolidated, derived
from pgtrickle.dvm.compile_types import InvalidPlanError
from pgtrickle.dvm.ir import WEIGHT, Materialized, Node, Scan
from pgtrickle.errors import UnsupportedQueryError

__all__ = ["Compiled", "Read", "ReadKind", "Reads", "RelationName", "consolidate", "inline_single_references"]

RelationName = str | tuple[str, ...]
"""A relation to read: one name (a Spark temporary view; a PostgreSQL relation on the search
path), or a schema-qualified tuple."""


class Reads(Protocol):
    """Names the relations a compiled query reads (the caller registers them)."""

    def post(self, scan: Scan) -> RelationName:
        """The relation holding ``scan.relation`` at the refresh snapshot: its ``source_columns``."""
        ...

    def delta(self, scan: Scan) -> RelationName:
        """The relation holding the change of ``scan.relation`` over the window: its
        ``source_columns`` and ``__pgt_w``."""
        ...

    def materialized(self, node: Materialized) -> RelationName:
        """The hidden stream table of ``node.node`` (at the window's start when ``node.pre``):
        ``node.columns``; with ``node.change``, its change over the window: ``node.columns`` and
        ``__pgt_w``."""
        ...


class ReadKind(StrEnum):
    POST = "post"
    DELTA = "delta"
    MATERIALIZED = "materialized"


@dataclass(frozen=True)
class Read:
    """One relation the query reads: ``node`` is the first ``Scan`` / ``Materialized`` resolved to
    it; ``uses`` how many times the query reads it (every path from the root to a leaf reading
    it: a shared subtree read by two consumers counts twice). Register it once; persist it
    when ``uses`` > 1."""

    kind: ReadKind
    name: RelationName
    node: Node
    uses: int


@dataclass(frozen=True)
class Compiled:
    """A compiled IR tree: ``query`` returns ``columns`` then ``__pgt_w``."""

    query: exp.Query
    columns: tuple[str, ...]
    reads: tuple[Read, ...]
    dialect: Dialect
    nodes: tuple[Node, ...] = ()
    """The IR node of each common table expression ``__pgt_n<i>``, by ``i`` (the root last)."""
    raw: exp.Query | None = None
    """The weighted query :meth:`consolidated` wrapped (``None``: not a consolidation)."""

    def sql(self, pretty: bool = False) -> str:
        """The query's text in its dialect.

        Raises:
            UnsupportedQueryError: the text cannot be expressed in the dialect, or (Spark) it
                contains ``${``, which Spark would substitute as a variable.
        """
        query = inline_single_references(self.query.copy()) if self.dialect == "spark" else self.query
        try:
            text = query.sql(dialect=self.dialect, pretty=pretty, unsupported_level=ErrorLevel.RAISE)
        except SqlglotError as err:
            raise UnsupportedQueryError(f"the plan cannot be expressed in {self.dialect} SQL: {err}") from err
        if self.dialect == "spark" and "${" in text:
            raise UnsupportedQueryError(
                "the plan contains '${', which Spark SQL would treat as a variable reference and substitute"
            )
        return text

    def consolidated(self) -> Compiled:
        """The same Z-set in canonical form (see :func:`consolidate`)."""
        return Compiled(
            consolidate(self.query, self.columns),
            self.columns,
            self.reads,
            self.dialect,
            self.nodes,
            self.query,
        )

    def unconsolidated_sql(self) -> str | None:
        """The text of the weighted query before :meth:`consolidated` grouped it (the same Z-set,
        rows not yet merged): for a caller that consolidates several such queries at once."""
        if self.raw is None:
            return None
        return Compiled(self.raw, self.columns, self.reads, self.dialect, self.nodes).sql()


def inline_single_references(query: exp.Query) -> exp.Query:
    """``query`` with every common table expression read from exactly one place written at that
    place, as a derived table under the name it was read by (pure; edits and returns ``query``).

    The same query: a CTE read once is the subquery it names. Spark analyses it faster: it
    resolves a chain of CTEs, each reading the one before, one link per pass of its analyzer
    over the whole plan - TPC-H Q9's change (23 CTEs, most read once) took 19 passes; with the
    CTEs read once inlined, 0.13 s of analysis became 0.06 s and 0.08 s of planning 0.04 s (a
    warm session, docs/BENCHMARKS.md). A CTE read from several places stays one (Spark inlines
    it after analysis; its text is written once). The names are the compiler's own
    (``__pgt_n<i>``), unique in one compiled query, so no reference is shadowed.
    """
    for with_ in list(query.find_all(exp.With)):
        scope = with_.parent
        if scope is None:
            continue
        ctes = {cte.alias_or_name: cte for cte in with_.expressions}
        references: dict[str, list[exp.Table]] = {}
        for found in scope.find_all(exp.Table):
            if not found.args.get("db") and not found.args.get("catalog") and found.name in ctes:
                references.setdefault(found.name, []).append(found)
        kept = []
        for name, cte in ctes.items():
            places = references.get(name, [])
            if len(places) != 1:
                kept.append(cte)
                continue
            place = places[0]
            alias = cte.args["alias"].copy()
            alias.set("this", exp.to_identifier(place.alias or name, quoted=True))
            place.replace(exp.Subquery(this=cte.this, alias=alias))
        if kept:
            with_.set("expressions", kept)
        else:
            with_.pop()
    return query


def consolidate(query: exp.Query, columns: tuple[str, ...] | list[str]) -> exp.Select:
    """Wrap a weighted query (``columns`` then ``__pgt_w``): group by all columns, sum the
    weights, drop the rows whose weights cancel - the final delta of a refresh."""
    for name in columns:
        if name == WEIGHT:
            raise InvalidPlanError(f"the column {WEIGHT} is the weight; it cannot be a row column")
    return consolidated(derived(query.copy(), "__pgt_d"), list(columns))
