"""Delta rule for a top-level GROUP BY / DISTINCT / UNION, as queries and PostgreSQL statements.

Pure: builds sqlglot trees and SQL text, never touches a database.

* :func:`state_query` — the defining query plus the hidden state columns; a
  FULL refresh of a differentially maintained stream table computes it.
* :func:`core_query` — the linear part under the aggregate, projected to the
  group keys (``__pgt_g<i>``), aggregate arguments (``__pgt_x<j>``) and
  FILTER conditions (``__pgt_f<j>``). Its delta (see
  :mod:`pgtrickle.dvm.linear`) aggregated per group is the change of every
  state column.
* :func:`merge_statements` — the PostgreSQL statements that fold per-group
  state deltas into the stream table (algebraic strategy).
* :func:`replace_statements` — those that replace the recomputed groups
  (rescan strategy).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from sqlglot import exp

from pgtrickle.dvm.analysis import COUNT_COLUMN, AggregateShape, AggSpec, same_expr
from pgtrickle.sql.ident import quote_ident

ROW_ID = "__pgt_row_id"
DELTA_TABLE = "pg_temp.__pgt_delta"
KEYS_TABLE = "pg_temp.__pgt_keys"


def key_arg(i: int) -> str:
    return f"__pgt_g{i}"


def value_arg(j: int) -> str:
    return f"__pgt_x{j}"


def filter_arg(j: int) -> str:
    return f"__pgt_f{j}"


def _base_select(shape: AggregateShape) -> exp.Select:
    select = shape.select.copy()
    select.set("order", None)
    if shape.rescan_source is not None:
        # SELECT __pgt_u.* FROM (<the set operation>) AS __pgt_u(...), not the UNION ALL of its branches
        select.args["from_"].this.set("this", shape.rescan_source.copy())
    if shape.distinct_source in ("DISTINCT", "UNION"):
        select.set("distinct", None)
        select.set("group", exp.Group(expressions=[k.expr.copy() for k in shape.keys]))
    return select


def state_query(shape: AggregateShape) -> exp.Select:
    """The stream table's rows with their hidden state columns (in ``hidden_columns`` order)."""
    select = _base_select(shape)
    hidden = shape.hidden_columns()
    exprs: dict[str, exp.Expr] = {}
    if COUNT_COLUMN in hidden:
        exprs[COUNT_COLUMN] = exp.Count(this=exp.Star(), big_int=True)
    for agg in shape.aggs:
        if agg.kind in ("sum", "avg"):
            assert agg.arg is not None
            exprs[agg.sum_column] = _with_filter(exp.Sum(this=agg.arg.copy()), agg.filter)
            exprs[agg.count_column] = _with_filter(exp.Count(this=agg.arg.copy(), big_int=True), agg.filter)
        elif agg.kind == "count":
            assert agg.arg is not None
            exprs[agg.count_column] = _with_filter(exp.Count(this=agg.arg.copy(), big_int=True), agg.filter)
        elif agg.kind == "count_star":
            exprs[agg.count_column] = _with_filter(exp.Count(this=exp.Star(), big_int=True), agg.filter)
    for key in shape.keys:
        if key.hidden:
            exprs[key.column] = key.expr.copy()
    for name in hidden:
        if name in exprs:
            select.append("expressions", exp.alias_(exprs[name], name, quoted=True))
    return select


def _with_filter(call: exp.Expr, filter_: exp.Expr | None) -> exp.Expr:
    if filter_ is None:
        return call
    return exp.Filter(this=call, expression=exp.Where(this=filter_.copy()))


def core_query(shape: AggregateShape) -> exp.Select:
    """The linear input of the aggregate, projected to keys, arguments and filters."""
    select = shape.select.copy()
    for arg in ("group", "having", "order", "distinct"):
        select.set(arg, None)
    exprs: list[exp.Expr] = [exp.alias_(k.expr.copy(), key_arg(k.index)) for k in shape.keys]
    for agg in shape.aggs:
        if agg.arg is not None and agg.kind in ("sum", "avg", "count"):
            exprs.append(exp.alias_(agg.arg.copy(), value_arg(agg.index)))
        if agg.filter is not None and agg.kind != "other":
            exprs.append(exp.alias_(exp.Paren(this=agg.filter.copy()), filter_arg(agg.index)))
    if not exprs:
        exprs.append(exp.alias_(exp.Literal.number(1), "__pgt_one"))
    select.set("expressions", exprs)
    return select


def rescan_query(shape: AggregateShape, key_relation: str) -> exp.Select:
    """The state query restricted to the groups listed in ``key_relation`` (``pgt_dvm.<view>``)."""
    select = state_query(shape)
    keys_alias = "__pgt_k"
    conds = [
        exp.NullSafeEQ(this=k.expr.copy(), expression=exp.column(key_arg(k.index), table=keys_alias))
        for k in shape.keys
    ]
    cond: exp.Expr = conds[0]
    for extra in conds[1:]:
        cond = exp.And(this=cond, expression=extra)
    schema, _, name = key_relation.partition(".")
    exists = exp.Exists(
        this=exp.Select(expressions=[exp.Literal.number(1)])
        .from_(
            exp.Table(
                this=exp.to_identifier(name),
                db=exp.to_identifier(schema),
                alias=exp.TableAlias(this=exp.to_identifier(keys_alias)),
            )
        )
        .where(cond)
    )
    return select.where(exists, copy=False)


# --------------------------------------------------------------------------- merge (PostgreSQL)


@dataclass(frozen=True)
class MergeSql:
    """Statements to run in order inside the apply transaction, with their roles."""

    delete: str
    update: str
    insert: str


def _col(table: str, name: str) -> exp.Column:
    return exp.column(exp.to_identifier(name, quoted=True), table=exp.to_identifier(table))


def _merged(
    agg: AggSpec, old: Callable[[str], exp.Expr], delta: Callable[[str], exp.Expr], kind: str
) -> exp.Expr:
    """The new value of one state column (``kind`` 'sum' or 'cnt') of ``agg``."""
    cnt = exp.Add(this=old(agg.count_column), expression=delta(agg.count_column))
    if kind == "cnt":
        return exp.Paren(this=cnt)
    total = exp.Add(
        this=exp.Coalesce(this=old(agg.sum_column), expressions=[exp.Literal.number(0)]),
        expression=exp.Coalesce(this=delta(agg.sum_column), expressions=[exp.Literal.number(0)]),
    )
    return exp.Case(
        ifs=[
            exp.If(this=exp.EQ(this=exp.Paren(this=cnt), expression=exp.Literal.number(0)), true=exp.Null())
        ],
        default=total,
    )


def _value(agg: AggSpec, state: Callable[[str], exp.Expr]) -> exp.Expr:
    """The aggregate's value from (merged) state columns."""
    if agg.kind in ("count", "count_star"):
        return state(f"{agg.index}:cnt")
    if agg.kind == "sum":
        return state(f"{agg.index}:sum")
    assert agg.kind == "avg"
    return exp.Div(
        this=exp.cast(exp.Paren(this=state(f"{agg.index}:sum")), "numeric"),
        expression=exp.Nullif(
            this=exp.cast(exp.Paren(this=state(f"{agg.index}:cnt")), "numeric"),
            expression=exp.Literal.number(0),
        ),
    )


def output_expression(
    shape: AggregateShape,
    output_expr: exp.Expr,
    key_ref: Callable[[int], exp.Expr],
    state: Callable[[str], exp.Expr],
) -> exp.Expr:
    """``output_expr`` with aggregate calls replaced by state values and keys by ``key_ref``."""
    by_sql = {a.node.sql("postgres"): a for a in shape.aggs}
    keys = [(k.expr, k.index) for k in shape.keys]

    def replace(node: exp.Expr) -> exp.Expr:
        for key_expr, index in keys:
            if same_expr(node, key_expr):
                return key_ref(index)
        spec = by_sql.get(node.sql("postgres")) if isinstance(node, (exp.AggFunc, exp.Filter)) else None
        if spec is not None:
            return exp.Paren(this=_value(spec, state))
        return node

    return output_expr.copy().transform(replace, copy=False)


def same_value(left: str, right: str, operator: str | None = None) -> str:
    """SQL that is true when two values are equal or both NULL (else false, never NULL).

    ``operator`` is ``None`` for ``IS NOT DISTINCT FROM`` (``=`` as resolved with
    ``search_path = pg_catalog``), or the schema-qualified ``OPERATOR(s.=)`` of a
    type whose ``=`` lives in another schema (``pgtrickle._equality_operator``).
    """
    if operator is None:
        return f"{left} IS NOT DISTINCT FROM {right}"
    return f"coalesce({left} {operator} {right} OR ({left} IS NULL AND {right} IS NULL), false)"


def key_match(shape: AggregateShape, left: str, right: str, equality: Mapping[str, str] | None = None) -> str:
    """The join condition matching the rows of ``left`` and ``right`` that hold the same group."""
    parts = [f"{left}.{ROW_ID} = {right}.{ROW_ID}"]
    for key in shape.keys:
        col = quote_ident(key.column)
        parts.append(same_value(f"{left}.{col}", f"{right}.{col}", (equality or {}).get(key.column)))
    return " AND ".join(parts)


def merge_statements(
    shape: AggregateShape, target: str, visible: Sequence[str], equality: Mapping[str, str] | None = None
) -> MergeSql:
    """Fold the per-group state deltas in ``__pgt_delta`` into ``target``.

    ``__pgt_delta`` holds the key columns, ``__pgt_row_id`` and the *change*
    of every hidden state column. Groups whose count reaches zero are
    deleted, others updated, new ones inserted; scalar aggregates (no GROUP
    BY) always keep their one row.
    """
    d, t = DELTA_TABLE, "t"
    agg_by_index = {a.index: a for a in shape.aggs}

    def old_col(name: str) -> exp.Expr:
        return _col(t, name)

    def delta_col(name: str) -> exp.Expr:
        return _col("d", name)

    def zero(name: str) -> exp.Expr:
        return exp.Literal.number(0) if not name.endswith("_sum") else exp.Null()

    def state_from(old: Callable[[str], exp.Expr]) -> Callable[[str], exp.Expr]:
        def state(ref: str) -> exp.Expr:
            index, _, kind = ref.partition(":")
            return _merged(agg_by_index[int(index)], old, delta_col, kind)

        return state

    hidden = shape.hidden_columns()
    non_key_outputs = [(o, name) for o, name in zip(shape.outputs, visible, strict=False) if o.key is None]

    def assignments(old: Callable[[str], exp.Expr], key_table: str) -> list[tuple[str, str]]:
        state = state_from(old)
        result = []
        for name in hidden:
            if name == COUNT_COLUMN:
                value: exp.Expr = exp.Add(this=old(COUNT_COLUMN), expression=delta_col(COUNT_COLUMN))
            elif name.startswith("__pgt_a"):
                index = int(name[len("__pgt_a") :].split("_")[0])
                value = _merged(
                    agg_by_index[index], old, delta_col, "sum" if name.endswith("_sum") else "cnt"
                )
            else:
                continue  # hidden keys never change
            result.append((name, value.sql("postgres")))
        for output, name in non_key_outputs:
            expr = output_expression(
                shape, output.expr, lambda i: _col(key_table, shape.keys[i].column), state
            )
            result.append((name, expr.sql("postgres")))
        return result

    updates = assignments(old_col, t)
    set_list = ", ".join(f"{quote_ident(n)} = {v}" for n, v in updates)
    if shape.scalar:
        update = f"UPDATE {target} AS t SET {set_list} FROM {d} AS d"
        return MergeSql(delete="", update=update, insert="")
    match = key_match(shape, "t", "d", equality)
    delete = (
        f"DELETE FROM {target} AS t USING {d} AS d WHERE {match} AND t.{COUNT_COLUMN} + d.{COUNT_COLUMN} = 0"
    )
    update = (
        f"UPDATE {target} AS t SET {set_list} FROM {d} AS d WHERE {match} "
        f"AND t.{COUNT_COLUMN} + d.{COUNT_COLUMN} <> 0"
    )
    inserts = assignments(zero, "d")
    key_cols = [k.column for k in shape.keys]
    cols = key_cols + [n for n, _ in inserts] + [ROW_ID]
    values = [f"d.{quote_ident(c)}" for c in key_cols] + [v for _, v in inserts] + [f"d.{ROW_ID}"]
    insert = (
        f"INSERT INTO {target} ({', '.join(quote_ident(c) for c in cols)}) "
        f"SELECT {', '.join(values)} FROM {d} AS d WHERE d.{COUNT_COLUMN} > 0 "
        f"AND NOT EXISTS (SELECT 1 FROM {target} AS t WHERE {match})"
    )
    return MergeSql(delete=delete, update=update, insert=insert)


def replace_statements(
    shape: AggregateShape, target: str, columns: Sequence[str], equality: Mapping[str, str] | None = None
) -> MergeSql:
    """Replace the groups listed in ``__pgt_keys`` by their recomputed rows in ``__pgt_delta``.

    ``columns`` are every stored column but ``__pgt_row_id`` (visible and hidden).
    Window partitions hold many rows per key: they are deleted and inserted
    whole; a group (one row per key) is updated in place when it survives.
    """
    d, k = DELTA_TABLE, KEYS_TABLE
    match_tk, match_dk = key_match(shape, "t", "k", equality), key_match(shape, "d", "k", equality)
    match_td = key_match(shape, "t", "d", equality)
    all_cols = [*columns, ROW_ID]
    if shape.many_rows_per_key:
        delete = f"DELETE FROM {target} AS t USING {k} AS k WHERE {match_tk}"
        insert = (
            f"INSERT INTO {target} ({', '.join(quote_ident(c) for c in all_cols)}) "
            f"SELECT {', '.join('d.' + quote_ident(c) for c in all_cols)} FROM {d} AS d"
        )
        return MergeSql(delete=delete, update="", insert=insert)
    delete = (
        f"DELETE FROM {target} AS t USING {k} AS k WHERE {match_tk} "
        f"AND NOT EXISTS (SELECT 1 FROM {d} AS d WHERE {match_dk})"
    )
    changing = [c for c in columns if c not in {key.column for key in shape.keys}]
    if changing:
        set_list = ", ".join(f"{quote_ident(c)} = d.{quote_ident(c)}" for c in changing)
        differs = " OR ".join(
            f"NOT ({same_value(f't.{quote_ident(c)}', f'd.{quote_ident(c)}', (equality or {}).get(c))})"
            for c in changing
        )
        update = f"UPDATE {target} AS t SET {set_list} FROM {d} AS d WHERE {match_td} AND ({differs})"
    else:
        update = ""
    insert = (
        f"INSERT INTO {target} ({', '.join(quote_ident(c) for c in all_cols)}) "
        f"SELECT {', '.join('d.' + quote_ident(c) for c in all_cols)} FROM {d} AS d "
        f"WHERE NOT EXISTS (SELECT 1 FROM {target} AS t WHERE {match_td})"
    )
    return MergeSql(delete=delete, update=update, insert=insert)


def finalize_statement(shape: AggregateShape, target: str, visible: Sequence[str]) -> str:
    """Recompute the aggregate outputs from the stored state, in PostgreSQL (after a FULL refresh).

    Spark's ``avg`` and numeric division keep fewer digits than PostgreSQL;
    evaluating the outputs over the exact state columns here makes a FULL
    refresh agree with PostgreSQL and with the differential merges after it.
    Empty when no output is an algebraic aggregate.
    """
    agg_by_index = {a.index: a for a in shape.aggs}

    def state(ref: str) -> exp.Expr:
        index, _, kind = ref.partition(":")
        agg = agg_by_index[int(index)]
        cnt = _col("t", agg.count_column)
        if kind == "cnt":
            return cnt
        return exp.Case(
            ifs=[exp.If(this=exp.EQ(this=cnt, expression=exp.Literal.number(0)), true=exp.Null())],
            default=_col("t", agg.sum_column),
        )

    assignments = []
    for output, name in zip(shape.outputs, visible, strict=False):
        if output.key is None and any(True for _ in _aggregate_nodes(output.expr)):
            expr = output_expression(shape, output.expr, lambda i: _col("t", shape.keys[i].column), state)
            assignments.append(f"{quote_ident(name)} = {expr.sql('postgres')}")
    if not assignments:
        return ""
    return f"UPDATE {target} AS t SET {', '.join(assignments)}"


def _aggregate_nodes(node: exp.Expr) -> Iterator[exp.AggFunc]:
    return node.find_all(exp.AggFunc)
