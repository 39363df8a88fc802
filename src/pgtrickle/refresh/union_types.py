"""The Spark types of a batch's parts, remembered so that parts of one type share a slot of the
batch's union (:func:`pgtrickle.refresh.tagged.shared_slots`).

A part's type is the type of its values' struct as Spark analysed it in an earlier union, where
the part had a slot of its own. It is remembered under what decides it: the Spark session (its
settings), the part's Spark SQL text (the views it names are the member's reads, registered
under names its plan fixes) and the PostgreSQL types, typmods included, of every column of every
source the member reads (what its reads carry to Spark: :mod:`pgtrickle.spark.carry` decides a
column's Spark type from its PostgreSQL type alone; a stream table upstream is such a source
too, and a hidden table's types follow from the query and these). A change of any of them is a
new key, met for the first time: the part gets a slot of its own again and its type is learnt
anew, so a stale type is never used.

The memory is per process and bounded (:data:`LIMIT` keys; the oldest forgotten first): a
daemon refreshes the same few hundred plans again and again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any

from pgtrickle.catalog.store import Source

__all__ = ["LIMIT", "forget", "key", "known", "learn"]

LIMIT = 4096
"""Keys remembered at most."""

_types: OrderedDict[Hashable, str] = OrderedDict()
_lock = threading.Lock()


def key(spark: Any, text: str, sources: Sequence[Source]) -> Hashable:
    """What decides the Spark type of a part whose delta is ``text`` over ``sources``' reads."""
    return (id(spark), text, tuple(sorted((s.relid, s.column_types) for s in sources)))


def known(keys: Sequence[Hashable]) -> list[str | None]:
    """Each key's type as learnt (``None``: never met, or forgotten)."""
    with _lock:
        found = [_types.get(k) for k in keys]
        for k, t in zip(keys, found, strict=True):
            if t is not None:
                _types.move_to_end(k)
        return found


def learn(union: Any, keys: Sequence[Hashable], slots: Sequence[int], types: Sequence[str | None]) -> None:
    """Remember the type of each part not known before (``types[i] is None``) from the schema of
    ``union`` (a DataFrame of :func:`~pgtrickle.refresh.tagged.union_sql` with ``slots``): its
    slot is its own, so the slot's struct type is the part's."""
    if all(t is not None for t in types):
        return
    fields = {f.name: f.dataType for f in union.schema.fields}
    with _lock:
        for k, slot, t in zip(keys, slots, types, strict=True):
            if t is None:
                _types[k] = fields[f"m{slot}"].simpleString()
                _types.move_to_end(k)
        while len(_types) > LIMIT:
            _types.popitem(last=False)


def forget() -> None:
    """Forget every type learnt (tests)."""
    with _lock:
        _types.clear()
