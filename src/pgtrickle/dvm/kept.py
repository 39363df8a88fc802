"""Hidden state tables, the pure part: which tables a stream table keeps, their names and queries.

A node of the defining query that :func:`pgtrickle.dvm.materialize.decide` keeps is stored in a
table of its own (``refresh/state_tables.py`` makes and fills them); this module names them: per
kept node, in tree order (children first), ``state_<pgt id>_<position>_<fingerprint>``, where the
fingerprint is a hash of the node's own query as PostgreSQL text over the sources
(:func:`node_query`). A changed query, or a source changed underneath, gives new names, so stale
tables are never read. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from pgtrickle.dvm import ir
from pgtrickle.dvm.compile import compile_ir
from pgtrickle.dvm.rules import aggregate

__all__ = ["SCHEMA", "StateTable", "fingerprint", "node_query", "plan_state_tables"]

SCHEMA = "pgtrickle_changes"


@dataclass(frozen=True, eq=False)
class StateTable:
    """One kept node: its place in the query (``position``, in tree order, children first),
    why it is kept, and its table."""

    position: int
    node: ir.Node
    reason: str
    query: str
    """The node's value as one PostgreSQL query over the sources (columns, then ``__pgt_w``)."""
    name: str

    @property
    def columns(self) -> tuple[str, ...]:
        return self.node.columns

    @property
    def hash_positions(self) -> tuple[int, ...]:
        """The columns its row identity ``__pgt_row_id`` hashes: an aggregate's kept state has one
        row per group and is identified by its group keys (its sums are added to in Spark, whose
        decimal types differ from the ones a FULL refresh computes them with); any other node by
        every column."""
        if aggregate.original_of(self.node) is not None:
            assert isinstance(self.node, ir.Aggregate)
            return tuple(range(len(self.node.keys)))
        return tuple(range(len(self.columns)))

    @property
    def qualified(self) -> str:
        """The table's name as SQL text (``pgtrickle_changes."state_…"``; names are plain ASCII)."""
        return f'{SCHEMA}."{self.name}"'


class _Sources:
    """Reads of a node's own query: every scan is its source table, as the query names it."""

    def __init__(self, relations: Mapping[str, tuple[str, str]]) -> None:
        self._relations = relations

    def post(self, scan: ir.Scan) -> tuple[str, str]:
        return self._relations[scan.relation]

    def delta(self, scan: ir.Scan) -> tuple[str, str]:  # pragma: no cover - a query has no Delta
        raise ValueError(f"a node's own query reads no change ({scan.relation})")

    def materialized(self, node: ir.Materialized) -> tuple[str, str]:  # pragma: no cover
        raise ValueError("a node's own query reads no hidden table")


def node_query(
    node: ir.Node,
    relations: Mapping[str, tuple[str, str]],
    column_types: Mapping[str, Mapping[str, str]] | None = None,
) -> str:
    """``node``'s value as one PostgreSQL query over the sources ``relations`` (a scan's
    relation → ``(schema, table)``): its columns, then its weight ``__pgt_w`` (pure)."""
    return compile_ir(node, _Sources(relations), dialect="postgres", column_types=column_types).sql()


def fingerprint(query: str) -> str:
    """The fingerprint of a kept node's query (part of its table's name)."""
    return hashlib.sha256(query.encode()).hexdigest()[:12]


def plan_state_tables(
    pgt_id: int,
    tree: ir.Node,
    kept: Mapping[ir.Node, str],
    relations: Mapping[str, tuple[str, str]],
    column_types: Mapping[str, Mapping[str, str]] | None = None,
) -> list[StateTable]:
    """The state tables of the stream table ``pgt_id`` whose query lowers to ``tree``, for the
    nodes ``kept`` (node → reason), children first (pure)."""
    out: list[StateTable] = []
    for node in ir.walk(tree):
        if node is tree or node not in kept:
            continue
        query = node_query(node, relations, column_types)
        position = len(out)
        out.append(
            StateTable(position, node, kept[node], query, f"state_{pgt_id}_{position}_{fingerprint(query)}")
        )
    return out
