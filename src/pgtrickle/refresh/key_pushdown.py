"""Key pushdown, the SQL: the condition that reads only a restriction's rows in PostgreSQL.

:func:`pgtrickle.dvm.keyed.restrictions` bounds each read of a delta plan by the keys of a change
(``KeySource``), or by the rows another read keeps (a *derived* ``KeySource``). This renders a
bound as a condition PostgreSQL evaluates in the read's JDBC query, at the refresh's exported
snapshot:

- a change's keys: their distinct values, listed (``col = ANY(CAST(<values> AS type[]))``), one
  query on the change buffer each (:meth:`KeyPushdown.delta_keys`);
- a derived source ``(relation, column)``: the values ``column`` holds in the rows of
  ``relation`` its own read keeps (``SELECT column FROM relation WHERE <the condition of
  relation's own read>``), at the same snapshot, so no value the plan meets is missed. A
  column's listed keys and derived sources make ONE ``col IN (<keys> UNION ALL <rows>)``, which
  PostgreSQL plans as a semi-join probing an index per key (TPC-H Q10's lines of the changed
  customers' orders: 70 ms, where OR-ed ``IN`` subqueries filtered all 6M lines in 5.8 s).
  When the keys' declared types differ, one ``IN`` each, OR-ed. A NULL among the rows' values
  keeps the rows whose column is NULL too (a NULL group key, an ``IS NOT DISTINCT FROM``
  join), tested only when the column is not declared NOT NULL. When the relation's own read is
  whole (small, or too many keys), nothing bounds this one either. A derived source with its
  own bounds (``KeySource.via``) takes the rows meeting them instead of the relation's read
  (``SELECT column FROM relation WHERE k = ANY(<change keys>)``: TPC-H Q2's part-suppliers of
  the changed suppliers);
- a composite key (a tuple of columns, from a join on several ``=``): the tuples its change
  holds, listed by position (``(a, b) IN (SELECT * FROM unnest(<a values>, <b values>))``), or a
  derived source's (``SELECT a, b FROM relation WHERE ...``); a tuple holding a NULL is left out,
  and rows with a NULL there are not read (no ``=`` meets them);
- several parts (:attr:`~pgtrickle.dvm.keyed.Restriction.others`) are OR-ed.

Whether a bound pays, and which column bounds a read best, are the pure decisions of
:mod:`pgtrickle.refresh.key_bounds`. This is a mixin of :class:`~pgtrickle.refresh.delta_reads.DeltaReads`,
which provides the sources, the change buffers and the window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql

from pgtrickle.catalog.store import Source
from pgtrickle.dvm.keyed import KeySource, Restriction
from pgtrickle.dvm.keyed_sources import Column, columns_of
from pgtrickle.refresh.context import RefreshContext
from pgtrickle.refresh.key_bounds import (
    PUSHDOWN_MAX_KEYS,
    PUSHDOWN_MIN_ROWS,
    narrowest,
    rows_per_value,
    should_push_down,
)
from pgtrickle.spark import jdbc
from pgtrickle.sql.ident import quote_ident

__all__ = ["KeyPushdown"]


def _array(literal: str, key_type: str) -> str:
    """Listed key values (a rendered array literal) as an array of their declared type."""
    return f"CAST({literal} AS {key_type}[])"


def _quoted(column: Column) -> str:
    """A column's SQL, or a composite key's row of columns ``(a, b)``."""
    if isinstance(column, str):
        return quote_ident(column)
    return "(" + ", ".join(quote_ident(c) for c in column) + ")"


KeyType = str | tuple[str, ...]
"""A key's declared type, or a composite key's types by position."""


def derived_relations(restriction: Restriction) -> set[str]:
    """The relations whose reads' rows bound ``restriction`` (its derived sources')."""
    return {k.relation for _, keys in restriction.parts() for k in keys if k.derived}


class KeyPushdown:
    """The conditions of key-bounded reads; mixed into ``DeltaReads`` (which sets the state)."""

    r: RefreshContext
    conn: psycopg.Connection
    timings: dict[str, float]
    _keys: dict[KeySource, tuple[list[Any], bool] | None]
    _stats: Mapping[int, jdbc.TableStats]
    _buffer_cols: Mapping[int, Mapping[str, str]]
    _restrictions: Mapping[tuple[str, object], Restriction]
    _post_conditions: dict[str, str | None]
    _not_nulls: dict[int, frozenset[str]]

    # Provided by DeltaReads.
    def _source(self, relation: str) -> Source:
        raise NotImplementedError

    def _buffer(self, source: Source, for_spark: bool) -> tuple[sql.Composable, sql.Composable]:
        raise NotImplementedError

    def _compared(self, relation: str) -> list[str]:
        raise NotImplementedError

    @staticmethod
    def _unchanged_updates(compared: Sequence[str]) -> sql.Composable:
        raise NotImplementedError

    def _fed(self, relation: str) -> Any:
        raise NotImplementedError

    def _add(self, what: str, value: float) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------ conditions
    def post_restriction(self, relation: str) -> Restriction | None:
        """The bound of ``relation``'s ``post`` read as it is read: the narrowest of its columns,
        none for an atomic group's upstream member bounded by more than one column or by other
        reads' rows (its change in the group's transaction is bounded by its own keys only)."""
        restriction = self._restrictions.get(("post", relation))
        if restriction is None:
            return None
        source = self._source(relation)
        if restriction.alternatives:
            restriction = self._narrowest(restriction, source, self._stats[source.relid].reltuples)
        group = self.r.group
        if (
            (restriction.others or derived_relations(restriction) or not isinstance(restriction.column, str))
            and group is not None
            and group.reads_from_group(source)
        ):
            return None
        return restriction

    def post_condition(self, relation: str) -> str | None:
        """The condition of ``relation``'s ``post`` read (``None``: read whole); the same text
        every time it is asked, so a derived bound selects exactly the rows that read keeps."""
        if relation not in self._post_conditions:
            source = self._source(relation)
            self._post_conditions[relation] = self._condition(
                self.post_restriction(relation), self._stats[source.relid].reltuples
            )
        return self._post_conditions[relation]

    def _condition(
        self, restriction: Restriction | None, table_rows: float, column: str | None = None
    ) -> str | None:
        """The condition reading only ``restriction``'s rows, when that pays (module docstring);
        ``column``: the SQL of the restricted column (default: ``restriction.column``, quoted;
        not with :attr:`~Restriction.others`, derived sources or a composite key)."""
        if restriction is None or (
            column is not None
            and (
                restriction.others
                or derived_relations(restriction)
                or not isinstance(restriction.column, str)
            )
        ):
            return None
        tests: list[str] = []
        total = derived_tests = 0
        for part_column, keys in restriction.parts():
            quoted = column or _quoted(part_column)
            changes = tuple(k for k in keys if not k.derived)
            members: list[str] = []
            if changes:
                found = self._key_values(Restriction(part_column, changes))
                if found is None:
                    return None
                values, with_null, key_type = found
                total += len(values)
                listed = self._listed(values, key_type)
                members.append(f"SELECT {'' if isinstance(key_type, str) else '* FROM '}unnest({listed})")
                if with_null:
                    tests.append(f"{quoted} IS NULL")
            derived = sorted(k for k in keys if k.derived)
            derived_tests += len(derived)
            for source in derived:
                found_rows = self._derived_rows(source)
                if found_rows is None:
                    return None
                rows, null_test = found_rows
                members.append(rows)
                if null_test is not None:
                    tests.append(f"({quoted} IS NULL AND {null_test})")
            if not derived and isinstance(part_column, str):
                assert changes
                # Listed keys alone: an index condition (= ANY) rather than a semi-join.
                tests.append(f"{quoted} = ANY({listed})")
            elif len({self._key_type(k) for k in keys}) == 1:
                # One IN over the union: PostgreSQL plans a semi-join (an index probe per key);
                # OR-ed IN subqueries would be a filter over every row of the table.
                tests.append(f"{quoted} IN ({' UNION ALL '.join(members)})")
            else:
                tests += [f"{quoted} IN ({m})" for m in members]
        if not should_push_down(table_rows, total):
            return None
        self._add("pushed_down_keys", total)
        if derived_tests:
            self._add("derived_bounds", derived_tests)
        composite = sum(not isinstance(c, str) for c, _ in restriction.parts())
        if composite:
            self._add("composite_key_bounds", composite)
        return tests[0] if len(tests) == 1 else "(" + " OR ".join(tests) + ")"

    def _listed(self, values: list[Any], key_type: KeyType) -> str:
        """Listed key values as arrays of their declared types: one array, or a composite key's
        one per position (the arguments of one ``unnest``)."""
        if isinstance(key_type, str):
            return _array(sql.Literal(values).as_string(self.conn), key_type)
        return ", ".join(
            _array(sql.Literal([v[i] for v in values]).as_string(self.conn), t)
            for i, t in enumerate(key_type)
        )

    def _key_type(self, key: KeySource) -> KeyType:
        types = dict(self._source(key.relation).column_types)
        if isinstance(key.column, str):
            return types[key.column]
        return tuple(types[c] for c in key.column)

    def _derived_rows(self, source: KeySource) -> tuple[str, str | None] | None:
        """The query of the values ``source.column`` holds in the rows ``source.relation``'s
        read keeps (with ``source.via``: in its rows meeting those bounds), and the test that one
        of them is NULL (``None``: the column is declared NOT NULL); ``None`` when that read is
        whole, or the relation is an upstream member of the atomic group (its rows at the
        snapshot are not its rows after the group's change)."""
        relation = self._source(source.relation)
        group = self.r.group
        if group is not None and group.reads_from_group(relation):
            return None
        bound = self._via_condition(source) if source.via else self.post_condition(source.relation)
        if bound is None:
            return None
        table = relation.qualified
        if not isinstance(source.column, str):  # a composite key: rows with a NULL there bound nothing
            return (
                f"SELECT {', '.join(quote_ident(c) for c in source.column)} FROM {table} WHERE {bound}",
                None,
            )
        column = quote_ident(source.column)
        rows = f"SELECT {column} FROM {table} WHERE {bound}"
        if source.column in self._not_null(relation):
            return rows, None
        return rows, f"EXISTS (SELECT FROM {table} WHERE ({bound}) AND {column} IS NULL)"

    def _via_condition(self, source: KeySource) -> str | None:
        """The rows of ``source.relation`` meeting ``source.via``: each bound's column holds one of
        its change keys (or is NULL, when a NULL is among them), all AND-ed; a bound whose keys
        cannot be listed is left out (fewer bounds keep more rows). ``None``: none is left."""
        tests = []
        for column, keys in source.via:
            found = self._key_values(Restriction(column, keys))
            if found is None:
                continue
            values, with_null, key_type = found
            quoted = quote_ident(column)
            test = f"{quoted} = ANY({self._listed(values, key_type)})"
            tests.append(f"({test} OR {quoted} IS NULL)" if with_null else test)
        return " AND ".join(tests) if tests else None

    def _not_null(self, source: Source) -> frozenset[str]:
        """The columns of ``source`` declared NOT NULL."""
        if source.relid not in self._not_nulls:
            rows = self.conn.execute(
                "SELECT attname::text FROM pg_catalog.pg_attribute WHERE attrelid = %s"
                " AND attnum > 0 AND attnotnull AND NOT attisdropped",
                (source.relid,),
            ).fetchall()
            self._not_nulls[source.relid] = frozenset(r[0] for r in rows)
        return self._not_nulls[source.relid]

    def _key_values(self, restriction: Restriction) -> tuple[list[Any], bool, KeyType] | None:
        """The distinct non-NULL key values of ``restriction`` (a composite key's: tuples without a
        NULL), whether a NULL is among them, and their type (``None``: too many, derived sources
        (not listed), or keys of several types — no one array holds them all exactly)."""
        if derived_relations(restriction):
            return None
        key_types = {self._key_type(k) for k in restriction.keys}
        if len(key_types) != 1:
            return None
        values: list[Any] = []
        with_null = False
        for keys in restriction.keys:
            found = self.delta_keys(keys)
            if found is None:
                return None
            values += found[0]
            with_null |= found[1]
        return list(dict.fromkeys(values)), with_null, key_types.pop()

    def _narrowest(self, restriction: Restriction, source: Source, table_rows: float) -> Restriction:
        """Of the columns that bound a read, the one whose keys select the fewest rows
        (:func:`~pgtrickle.refresh.key_bounds.narrowest`)."""
        candidates = restriction.candidates()
        if table_rows < PUSHDOWN_MIN_ROWS:
            return restriction
        counts: dict[Column, int | None] = {}
        for candidate in candidates:
            found = self._key_values(candidate)
            counts[candidate.column] = None if found is None else len(found[0]) + found[1]
        columns = sorted({c for candidate in candidates for c in columns_of(candidate.column)})
        per_value = rows_per_value(self.conn, source, columns, table_rows)
        return narrowest(candidates, counts, per_value, table_rows)

    def delta_keys(self, keys: KeySource) -> tuple[list[Any], bool] | None:
        """The distinct non-NULL values of a source column in the window's changes, and whether
        a NULL is among them (``None``: more than :data:`PUSHDOWN_MAX_KEYS`)."""
        assert not keys.derived
        if keys in self._keys:
            return self._keys[keys]
        if self._fed(keys.relation) is not None:
            return None  # its change is partly in the batch's job, not yet in its buffer: no pushdown
        source = self._source(keys.relation)
        available = self._buffer_cols.get(source.relid, {})
        bufs = [available.get(c) for c in columns_of(keys.column)]
        found: tuple[list[Any], bool] | None = None
        if all(b is not None for b in bufs):
            buffer, window = self._buffer(source, for_spark=False)
            names = [sql.Identifier(f"v{i}") for i in range(len(bufs))]

            def side(prefix: str) -> sql.Composable:
                return sql.SQL(", ").join(
                    sql.SQL("{} AS {}").format(sql.Identifier(prefix + str(b)), n)
                    for b, n in zip(bufs, names, strict=True)
                )

            composite = not isinstance(keys.column, str)
            rows = self.conn.execute(
                sql.SQL(
                    "SELECT DISTINCT {v} FROM (SELECT {n} FROM {b} WHERE {w}"
                    " AND action IN ('I','U'){u} UNION ALL SELECT {o} FROM {b} WHERE {w}"
                    " AND action IN ('D','U'){u}) s{nn} LIMIT {lim}"
                ).format(
                    v=sql.SQL(", ").join(names),
                    n=side("new_"),
                    o=side("old_"),
                    b=buffer,
                    w=window,
                    u=self._unchanged_updates(self._compared(keys.relation)),
                    # A composite key's tuples holding a NULL bound no row: left out.
                    nn=sql.SQL(" WHERE {}").format(
                        sql.SQL(" AND ").join(sql.SQL("{} IS NOT NULL").format(n) for n in names)
                    )
                    if composite
                    else sql.SQL(""),
                    lim=sql.Literal(PUSHDOWN_MAX_KEYS + 2),
                )
            ).fetchall()
            values = [tuple(r) if composite else r[0] for r in rows if composite or r[0] is not None]
            if len(values) <= PUSHDOWN_MAX_KEYS:
                found = (values, len(values) < len(rows))
        self._keys[keys] = found
        return found
