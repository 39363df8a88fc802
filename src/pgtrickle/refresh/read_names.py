"""How a differential refresh names what its plans read, and the errors its reads raise.

:class:`ReadNames` names the Spark view of every read of a stream table's plans
(deterministically, so a plan compiled once is reused at every refresh); ``refresh/delta_reads.py``
registers them. :class:`FallbackToFull` and :class:`NotChained` are what a read raises when the
refresh cannot run differentially, or not chained in its batch's job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pgtrickle.catalog.store import Source
from pgtrickle.dvm import ir
from pgtrickle.dvm.kept import StateTable, fingerprint
from pgtrickle.errors import PgTrickleError, UnsupportedQueryError

__all__ = [
    "KEPT_CHANGE_PREFIX",
    "KEPT_PREFIX",
    "FallbackToFull",
    "NotChained",
    "ReadNames",
    "relation_key",
    "spark_name",
]

KEPT_PREFIX = "pgt_kept_"
"""Spark views of hidden state tables: ``pgt_kept_<pgt id>_<fingerprint>``."""
KEPT_CHANGE_PREFIX = "pgt_kept_change_"
"""Spark views of hidden state tables' changes: ``pgt_kept_change_<pgt id>_<fingerprint>``."""


class FallbackToFull(PgTrickleError):
    """This refresh cannot run differentially; the message says why (it runs FULL instead)."""


class NotChained(PgTrickleError):
    """A batch member cannot be computed from its upstream member's delta in the same job
    (refresh/chained.py); the message says why (it refreshes on its own after that member)."""


def spark_name(name: str) -> str:
    """A column name as a Spark column reference (backquoted)."""
    return "`" + name.replace("`", "``") + "`"


def relation_key(source: Source) -> str:
    """The name the lowering gives ``source`` (``schema.table``, as the schema map keys it)."""
    return f"{source.schema}.{source.name}"


class ReadNames:
    """The :class:`~pgtrickle.dvm.compile.Reads` of one stream table's plans: a view per source
    and kind (``pgt_<id>_post_<relid>``, ``pgt_<id>_delta_<relid>``, ``pgt_<id>_state``)."""

    def __init__(
        self,
        pgt_id: int,
        relids: Mapping[str, int],
        kept: Mapping[str, StateTable] | None = None,
        fingerprint_of: Callable[[ir.Node], str] | None = None,
    ) -> None:
        self._pgt_id = pgt_id
        self._relids = relids
        self._kept = kept or {}
        self._fingerprint_of = fingerprint_of

    def _relid(self, scan: ir.Scan) -> int:
        if scan.relation not in self._relids:
            raise UnsupportedQueryError(f"the query reads {scan.relation}, which is not a recorded source")
        return self._relids[scan.relation]

    def post(self, scan: ir.Scan) -> str:
        return f"pgt_{self._pgt_id}_post_{self._relid(scan)}"

    def delta(self, scan: ir.Scan) -> str:
        return f"pgt_{self._pgt_id}_delta_{self._relid(scan)}"

    def materialized(self, node: ir.Materialized) -> str:
        if not node.pre and not node.change:
            raise UnsupportedQueryError(
                "the plan reads a hidden table at the snapshot, which no refresh stores"
            )
        if self._kept and self._fingerprint_of is not None:
            fp = self._fingerprint_of(node.node)
            if fp in self._kept:
                return f"{KEPT_CHANGE_PREFIX if node.change else KEPT_PREFIX}{self._pgt_id}_{fp}"
        return f"pgt_{self._pgt_id}_state"

    def kept_table(self, node: ir.Node) -> StateTable:
        """The hidden state table keeping ``node`` (FallbackToFull when there is none)."""
        fp = self._fingerprint_of(node) if self._fingerprint_of is not None else None
        if fp is None or fp not in self._kept:
            raise FallbackToFull("a node the query keeps has no hidden state table yet")
        return self._kept[fp]

    def kept_views(self) -> dict[str, StateTable]:
        """The Spark view name of every hidden state table."""
        return {f"{KEPT_PREFIX}{self._pgt_id}_{fp}": table for fp, table in self._kept.items()}

    def kept_change_view(self, table: StateTable) -> str:
        """The Spark view of a hidden state table's change (registered by the refresh once it
        has computed the change, before any plan reading it runs)."""
        return f"{KEPT_CHANGE_PREFIX}{self._pgt_id}_{fingerprint(table.query)}"
