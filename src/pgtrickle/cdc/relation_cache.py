"""Turning decoded tuples into rows: the Relation messages seen on a connection, by relation OID.

Pure: :class:`RelationCache` maps a tuple's columns to the names its
Relation message gave them.
"""

from __future__ import annotations

from typing import Any, Final, TypeVar, overload

from pgtrickle.cdc.pgoutput_messages import Message, PgOutputError, Relation, TupleData


class _Unchanged:
    """Type of :data:`UNCHANGED_TOAST`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Final = _Unchanged()


"""A ready-made sentinel for ``RelationCache.row_dict(..., unchanged=UNCHANGED_TOAST)``."""


_RAISE: Final = object()


_T = TypeVar("_T")


class RelationCache:
    """The Relation messages seen so far on a replication connection, by relation OID.

    pgoutput sends a Relation message before the first change of each table
    in a session (and again when the table's definition changes); feed every
    decoded message to :meth:`observe` (or Relations to :meth:`add`) and use
    :meth:`row_dict` to turn tuples into column-name dictionaries.
    """

    __slots__ = ("_names", "_relations")

    def __init__(self) -> None:
        self._relations: dict[int, Relation] = {}
        self._names: dict[int, tuple[str, ...]] = {}

    def add(self, relation: Relation) -> None:
        self._relations[relation.relid] = relation
        self._names[relation.relid] = tuple(c.name for c in relation.columns)

    def observe(self, message: Message) -> None:
        """Remember ``message`` if it is a Relation; ignore any other message."""
        if type(message) is Relation:
            self.add(message)

    def get(self, relid: int) -> Relation:
        try:
            return self._relations[relid]
        except KeyError:
            raise PgOutputError(
                f"no Relation message was seen for relation OID {relid}; pgoutput sends one "
                "before the first change of each table on a connection, so every message of "
                "the connection must be passed to RelationCache.observe()"
            ) from None

    def __contains__(self, relid: object) -> bool:
        return relid in self._relations

    def __len__(self) -> int:
        return len(self._relations)

    def clear(self) -> None:
        self._relations.clear()
        self._names.clear()

    @overload
    def row_dict(self, relid: int, tuple_data: TupleData) -> dict[str, str | None]: ...

    @overload
    def row_dict(self, relid: int, tuple_data: TupleData, *, unchanged: _T) -> dict[str, str | _T | None]: ...

    def row_dict(self, relid: int, tuple_data: TupleData, *, unchanged: Any = _RAISE) -> dict[str, Any]:
        """Map the relation's column names to the tuple's text values (``None`` for NULL).

        An unchanged TOASTed value (kind ``'u'``, an Update that did not touch
        a large column) has no value to give: it raises :class:`PgOutputError`
        unless ``unchanged`` is given, which is then used in its place (e.g.
        :data:`UNCHANGED_TOAST`). Binary values (kind ``'b'``) raise too: they
        are type-specific bytes, not text; request ``binary 'false'``.
        """
        names = self._names.get(relid)
        if names is None:
            self.get(relid)  # raises
            raise AssertionError  # pragma: no cover
        if len(names) != len(tuple_data):
            relation = self._relations[relid]
            raise PgOutputError(
                f"relation {relation.namespace}.{relation.name} (OID {relid}) has {len(names)} "
                f"columns but the tuple has {len(tuple_data)}; was a Relation message missed?"
            )
        row: dict[str, Any] = {}
        for name, (kind, value) in zip(names, tuple_data, strict=True):
            if kind == "t" or kind == "n":
                row[name] = value
            elif kind == "u":
                if unchanged is _RAISE:
                    relation = self._relations[relid]
                    raise PgOutputError(
                        f"column {name!r} of {relation.namespace}.{relation.name} is an unchanged "
                        "TOASTed value that pgoutput did not send; pass unchanged=<sentinel> to "
                        "row_dict() to get a placeholder, or set REPLICA IDENTITY FULL on the table"
                    )
                row[name] = unchanged
            else:
                relation = self._relations[relid]
                raise PgOutputError(
                    f"column {name!r} of {relation.namespace}.{relation.name} arrived in binary "
                    "format, which row_dict() cannot turn into text; start replication with "
                    "binary 'false'"
                )
        return row

    def key_dict(self, relid: int, tuple_data: TupleData) -> dict[str, str | None]:
        """Like :meth:`row_dict` but only the replica-identity key columns (``is_key``)."""
        relation = self.get(relid)
        row = self.row_dict(relid, tuple_data, unchanged=UNCHANGED_TOAST)
        key: dict[str, str | None] = {}
        for column in relation.columns:
            if column.is_key:
                value = row[column.name]
                if value is UNCHANGED_TOAST:
                    self.row_dict(relid, tuple_data)  # raises the unchanged-TOAST error
                key[column.name] = value  # type: ignore[assignment]  # row_dict raised for UNCHANGED_TOAST
        return key
