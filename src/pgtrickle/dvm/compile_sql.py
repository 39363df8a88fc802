"""SQL building blocks of the IR compiler (:mod:`pgtrickle.dvm.compile`): pure sqlglot trees.

Every relation the compiler builds carries the node's columns, in order, then the weight
column ``__pgt_w`` (BIGINT). Names are always quoted identifiers, so a column called
``a"b``, ``a`b``, ``x.y`` or ``two words`` renders correctly in both dialects (PostgreSQL
``"a""b"``, Spark ```a"b```), and expressions of the IR (PostgreSQL semantics) are rendered
as they are for PostgreSQL and through :func:`pgtrickle.sql.translate.translate_expression`
for Spark.

The two blocks that give weights their meaning for non-linear operators:

- :func:`positive` - a relation's *consolidated positive weights*: rows grouped by all
  columns, weights summed, only rows whose net weight is positive kept. A relation whose
  weights are known to be all positive (a table read, a non-linear operator's output) is
  already that as a multiset and is used as it is (no GROUP BY).
- :func:`expand` - each row repeated by its weight (``generate_series`` on PostgreSQL,
  ``explode(sequence(...))`` on Spark), for operators whose result depends on multiplicity
  in a way no weighted formula reproduces exactly (windows, ``string_agg``, ...).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from sqlglot import exp
from sqlglot.errors import SqlglotError

from pgtrickle.dvm.ir import WEIGHT
from pgtrickle.sql.translate import expression_type, translate_expression

Dialect = Literal["spark", "postgres"]
DIALECTS: tuple[Dialect, ...] = ("spark", "postgres")

RESERVED_PREFIX = "__pgt_"
"""The prefix of the names the compiler gives its own columns and relations."""

COPY = "__pgt_n"
"""The generated copy number of an expanded row."""
END = "__pgt_end"
SIDE = "__pgt_side"
LEFT_COUNT = "__pgt_lc"
RIGHT_COUNT = "__pgt_rc"

RESERVED_COLUMNS = frozenset({WEIGHT, COPY, END, SIDE, LEFT_COUNT, RIGHT_COUNT})
"""The column names the compiler adds next to a node's columns; no IR column may be one of them.
Other ``__pgt_``-prefixed names are the delta rules' own (touched keys ``__pgt_k<i>``, an
aggregate state's ``__pgt_count``, ``__pgt_n_<column>``...) and are ordinary columns here."""

Types = Mapping[str, "str | None"]
"""Column name -> PostgreSQL type category (``None``: unknown)."""


def ident(name: str) -> exp.Identifier:
    return exp.Identifier(this=name, quoted=True)


def col(name: str, table: str | None = None) -> exp.Column:
    return exp.Column(this=ident(name), table=ident(table) if table is not None else None)


def weight(table: str | None = None) -> exp.Column:
    return col(WEIGHT, table)


def alias(expression: exp.Expr, name: str) -> exp.Alias:
    return exp.Alias(this=expression, alias=ident(name))


def bigint(expression: exp.Expr) -> exp.Cast:
    return exp.Cast(this=expression, to=exp.DataType.build("BIGINT"))


def one() -> exp.Cast:
    """The weight of a row read once: ``CAST(1 AS BIGINT)``."""
    return bigint(exp.Literal.number(1))


def table(name: str | tuple[str, ...], as_: str | None = None) -> exp.Table:
    """A relation by name (a tuple is schema-qualified), aliased ``as_``."""
    parts = (name,) if isinstance(name, str) else tuple(name)
    if not parts or len(parts) > 3 or not all(isinstance(p, str) and p for p in parts):
        raise ValueError(f"a relation name must be 1 to 3 non-empty strings, got {name!r}")
    node = exp.Table(
        this=ident(parts[-1]),
        db=ident(parts[-2]) if len(parts) > 1 else None,
        catalog=ident(parts[-3]) if len(parts) > 2 else None,
    )
    if as_ is not None:
        node.set("alias", exp.TableAlias(this=ident(as_)))
    return node


def derived(query: exp.Query, as_: str) -> exp.Subquery:
    return exp.Subquery(this=query, alias=exp.TableAlias(this=ident(as_)))


def select(projections: Iterable[exp.Expr], source: exp.Expr | None = None) -> exp.Select:
    node = exp.Select(expressions=list(projections))
    if source is not None:
        node.set("from_", exp.From(this=source))
    return node


def columns_of(names: Sequence[str], table_alias: str | None = None) -> list[exp.Expr]:
    return [col(n, table_alias) for n in names]


def group_by(query: exp.Select, names: Sequence[str]) -> exp.Select:
    """GROUP BY the named columns (no clause at all for none: the whole input is one group)."""
    if names:
        query.set("group", exp.Group(expressions=columns_of(names)))
    return query


def sum_weights(expression: exp.Expr | None = None) -> exp.Sum:
    return exp.Sum(this=expression if expression is not None else weight())


# --------------------------------------------------------------------------- weights


def positive(source: exp.Expr, names: Sequence[str]) -> exp.Select:
    """Consolidated positive weights: ``SELECT cols, sum(w) ... GROUP BY cols HAVING sum(w) > 0``."""
    query = select([*columns_of(names), alias(bigint(sum_weights()), WEIGHT)], source)
    query = group_by(query, names)
    query.set("having", exp.Having(this=exp.GT(this=sum_weights(), expression=exp.Literal.number(0))))
    return query


def consolidated(source: exp.Expr, names: Sequence[str]) -> exp.Select:
    """A Z-set's canonical form: rows grouped by all columns, weights summed, zeros dropped."""
    query = select([*columns_of(names), alias(bigint(sum_weights()), WEIGHT)], source)
    query = group_by(query, names)
    query.set("having", exp.Having(this=exp.NEQ(this=sum_weights(), expression=exp.Literal.number(0))))
    return query


def expand(source: exp.Expr, names: Sequence[str], dialect: Dialect) -> exp.Select:
    """Each row of ``source`` (positive weights) repeated ``__pgt_w`` times; output: the columns
    and the copy number ``__pgt_n`` (the weight column is dropped: every copy weighs 1)."""
    bounds = [one(), weight()]
    series: exp.Expr
    if dialect == "spark":
        sequence = exp.Anonymous(this="sequence", expressions=bounds)
        series = exp.Anonymous(this="explode", expressions=[sequence])
    else:
        series = exp.Anonymous(this="generate_series", expressions=bounds)
    return select([*columns_of(names), alias(series, COPY)], source)


# --------------------------------------------------------------------------- expressions


def quoted(expression: exp.Expr) -> exp.Expr:
    """A copy of an IR expression whose column references are quoted (IR names are exact)."""
    copy = expression.copy()
    for column in list(copy.find_all(exp.Column)):
        for key in ("this", "table"):
            part = column.args.get(key)
            if isinstance(part, exp.Identifier):
                part.set("quoted", True)
    return copy


def render(expression: exp.Expr, types: Types, dialect: Dialect) -> exp.Expr:
    """An IR expression (PostgreSQL semantics) as an expression of ``dialect`` over ``types``' columns.

    Raises:
        UnsupportedQueryError: (Spark) the expression has no Spark equivalent.
    """
    copy = quoted(expression)
    if dialect == "postgres":
        return copy
    return translate_expression(copy, {**_known(types), WEIGHT: "int8"})


def type_of(expression: exp.Expr, types: Types) -> str | None:
    """The PostgreSQL type category of an IR expression over columns of ``types``."""
    return expression_type(quoted(expression), {**_known(types), WEIGHT: "int8"})


def _known(types: Types) -> dict[str, str]:
    return {name: t for name, t in types.items() if t is not None}


def common_type(types: Iterable[str | None]) -> str | None:
    """The type of one column of a UNION ALL / set operation: the branches' type when they agree."""
    known = list(types)
    if known and all(t is not None and t == known[0] for t in known):
        return known[0]
    return None


_UNTYPED = (None, "null")


def union_type(types: Iterable[str | None]) -> str | None:
    """The type of one column of a UNION ALL whose branches may hold untyped values (a padded
    NULL): the known branches' type when they agree, ignoring the unknown ones."""
    known = {t for t in types if t not in _UNTYPED}
    return known.pop() if len(known) == 1 else None


def cast_untyped(column: exp.Expr, own: str | None, target: str | None, dialect: Dialect) -> exp.Expr:
    """``column`` of a UNION ALL branch, cast to the union's ``target`` type where its ``own`` type
    is unknown (PostgreSQL resolves an untyped NULL in a CTE to ``text``, which no UNION with an
    integer column accepts; Spark coerces its NULL type by itself)."""
    if dialect != "postgres" or own not in _UNTYPED or target is None:
        return column
    try:
        return exp.Cast(this=column, to=exp.DataType.build(target, dialect="postgres"))
    except (ValueError, SqlglotError):
        return column
