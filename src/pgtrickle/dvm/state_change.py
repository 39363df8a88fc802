"""The change of a stored aggregate state: the aggregate of the weighted change (pure).

A stream table keeping its root aggregate's state (:mod:`pgtrickle.dvm.stored`) is refreshed by
adding, per touched group, the change of every additive state column - never by reading the
stored state in Spark. The change ``ΔX`` of the aggregate's *input* comes from the
compositional rules (:func:`pgtrickle.dvm.rules.delta`: telescoping joins, filters, ...); ONE
weighted aggregation over it gives, per group::

    Δ__pgt_count = Σ w          Δcount(x) = Σ w [x IS NOT NULL]       Δsum(x) = Σ x·w

each under its FILTER (:func:`pgtrickle.dvm.compile_ops.state_change`). PostgreSQL then merges
these deltas into the stored rows (``refresh/state_merge.py``): state += delta, a SUM with no
non-NULL value left is NULL, an AVG is recomputed from its hidden sum and count, a group whose
row count reaches 0 is deleted and a new group inserted. The query returns, per touched group,
the stored state columns (:attr:`StoredAggregate.written`, keys first) holding the *changes*,
and ``__pgt_w`` = 1 (the :class:`~pgtrickle.dvm.compile.Compiled` contract; it is no multiplicity).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from pgtrickle.dvm import compile_ops as ops
from pgtrickle.dvm import ir, rules
from pgtrickle.dvm.compile import Compiled, Reads, compile_ir
from pgtrickle.dvm.compile_sql import Dialect, alias, col, derived, one, select
from pgtrickle.dvm.compile_types import node_types
from pgtrickle.dvm.stored import StoredAggregate

__all__ = ["StateChange", "state_change"]


@dataclass(frozen=True)
class StateChange:
    """The compiled change of a stored state for one set of changed relations."""

    change: ir.Node
    """The plan of the aggregate input's change (the relations it reads are the query's)."""
    compiled: Compiled
    """Per touched group: the stored state columns holding their changes, then ``__pgt_w`` = 1."""


def state_change(
    stored: StoredAggregate,
    changed: frozenset[str],
    materialized: Collection[ir.Node],
    reads: Reads,
    column_types: Mapping[str, Mapping[str, str]],
    dialect: Dialect = "spark",
) -> StateChange | None:
    """The query of the state's change per touched group, ``None`` when nothing under the
    aggregate changed (``changed``: the relations with pending changes)."""
    root = stored.root
    change = rules.delta(root.input, changed, materialized)
    if change is None:
        return None
    compiled = compile_ir(change, reads, dialect=dialect, column_types=column_types)
    types = node_types(change, column_types, {})
    grouped = ops.state_change(
        derived(compiled.query, "__pgt_c"),
        list(change.columns),
        types,
        root.keys,
        stored.state.aggregates,
        dialect,
    )
    renamed = select(
        [
            *(alias(col(state_column), stored_column) for state_column, stored_column in stored.names),
            alias(one(), ir.WEIGHT),
        ],
        derived(grouped, "__pgt_g"),
    )
    return StateChange(change, Compiled(renamed, stored.written, compiled.reads, dialect))
