"""Translate a stream table's defining query from PostgreSQL SQL to Spark SQL.

Every refresh computes the defining query on Spark: the source tables are read
from PostgreSQL over JDBC and registered as Spark temporary views, and the
query, written by the user in PostgreSQL SQL, runs as Spark SQL.  The stored
result must equal what PostgreSQL itself would return, so this module does not
just transpile syntax: it rewrites the constructs whose *semantics* differ
between the two engines, and refuses the ones it cannot reproduce.

The input is PostgreSQL's normalised query text (``pg_get_viewdef(view, true)``
run with ``search_path = pg_catalog``): every table is schema-qualified,
implicit coercions appear as explicit casts (``10::numeric``, ``'open'::text``,
``status::text``), ``IN (list)`` appears as ``= ANY (ARRAY[...])``, ``LIKE``
as ``~~``, negative constants as ``'-5'::integer`` and so on.  Parsing is done
with sqlglot's ``postgres`` dialect and generation with its ``spark`` dialect;
everything in between is this module's own rewriting.

Public API
----------
``parse_query``          parse one SELECT / set-operation query.
``referenced_tables``    the (schema, table) pairs a query reads.
``unsupported_reason``   why a query cannot run on Spark, or ``None``.
``is_volatile``          whether the result can change without the data changing.
``translate_to_spark``   the Spark SQL text to run.
``translate_expression`` one expression over typed input columns, as a Spark expression.
``expression_type``      the inferred PostgreSQL type category of one such expression.

This module holds the entry points; the work is done by its siblings:
``parse.py`` (parsing, the tables a query reads), ``support.py`` (the
``unsupported_reason`` checks), ``functions.py`` (the function tables),
``typing_rules.py`` and ``type_inference.py`` (PostgreSQL types of
expressions), ``rewrite_expressions.py`` with ``rewrite_casts.py`` (expression
semantics), ``rewrite_query.py`` (``ANY``/``ALL`` and ``DISTINCT ON``) and
``nodes.py`` (sqlglot helpers they share).

Semantic decisions
------------------
Types.  Several PostgreSQL operators behave differently depending on operand
types (``/`` on two integers truncates).  The translator infers PostgreSQL
types itself: from literals, casts, well-known functions and, when the caller
passes ``column_types`` to :func:`translate_to_spark`, from the source
columns (resolved through aliases, derived tables, CTEs and set operations).
Pass ``column_types`` whenever you can; without it, column types are unknown
and the decisions below fall back to a run-time test on Spark's
``typeof(...)`` of the operand, which gives the right *values* but can give a
wider Spark type (for instance ``DOUBLE`` holding an integer quotient).

Integer division.  ``int / int`` truncates toward zero in PostgreSQL; Spark's
``/`` always produces a fractional result.  When both operands are known
integers the translation is ``a DIV b`` (Spark's integral division, also
truncating toward zero), cast back to ``INT``/``SMALLINT`` when neither
operand is ``bigint`` so that out-of-range results fail as they do in
PostgreSQL.  When an operand type is unknown the translation is
``CASE WHEN typeof(a) IN (<integer types>) AND ... THEN CAST(a AS BIGINT)
DIV CAST(b AS BIGINT) ELSE a / b END``; nested arithmetic is looked through,
so ``a / b / c`` tests ``a``, ``b`` and ``c``.  (Without ``column_types`` a
column of a derived table or CTE that is itself such a run-time quotient is
seen as ``DOUBLE`` by an outer division; pass ``column_types``.)  Division by
zero raises an error in both engines (Spark runs with
``spark.sql.ansi.enabled``, the Spark 4 default, which this translation
relies on for overflow and cast errors too).

Numeric.  PostgreSQL ``numeric`` without a type modifier has unlimited
precision; Spark decimals have at most 38 digits and a fixed scale per
expression, so no single Spark type is exact for every value.  Rather than a
blanket ``DECIMAL(38, 10)`` (which silently rounds values with more than ten
fraction digits) the cast ``x::numeric`` becomes the narrowest exact type:

* a constant becomes a decimal of exactly its own precision and scale
  (``10::numeric`` -> ``CAST('10' AS DECIMAL(2, 0))``, ``'-0.5'::numeric`` ->
  ``DECIMAL(1, 1)``), so arithmetic keeps every digit;
* ``smallint``/``integer``/``bigint`` operands become ``DECIMAL(5|10|20, 0)``,
  which holds every value of the type;
* an operand that is already ``numeric`` is left alone (the cast is a no-op in
  PostgreSQL too);
* a ``double precision``/``real`` operand is converted the way PostgreSQL does
  it, through its 15-significant-digit text form, into ``DECIMAL(38, 18)``;
* an operand of unknown type becomes ``DECIMAL(38, 18)``.  That is the type
  Spark's JDBC reader already gives to unconstrained ``numeric`` columns, so
  the cast cannot lose digits the data still has; it holds every ``bigint``
  exactly and fails loudly (ANSI overflow error) rather than rounding when a
  value has more than 20 integer digits.

``numeric(p, s)`` maps to ``DECIMAL(p, s)`` (both round half away from zero);
precisions above 38 are refused.  Addition, subtraction and multiplication of
decimals are exact in Spark as long as the result fits 38 digits.

Numeric division and ``avg``.  PostgreSQL rounds a numeric quotient to
``max(16 - 4 * qweight, dscale(a), dscale(b))`` digits (at least 16
significant ones), Spark to ``max(6, s1 + p2 + 1)``.  So every quotient with
a numeric result (``numeric / numeric``, ``numeric / integer``) and every
``avg`` of an integer or numeric (``sum / count``, also under ``FILTER`` and
``OVER``) becomes a call of the row function ``pgt_numeric_div``
(``sql/numeric_division.py``: PostgreSQL's rule, exactly), cast to a decimal
type chosen from the operands' integer digits and display scales
(``sql/numeric_scale.py``, which the type inference annotates).  A row whose
quotient does not fit that type, or depends on a display scale Spark does not
carry (an unconstrained ``numeric``), fails the refresh with SQLSTATE 22003
naming the expression; docs/TYPES.md has the rule and its residual refusals.
The Spark session must have the function registered
(``pgtrickle.spark.numeric.ensure_functions``).  Without ``column_types`` an
operand of unknown type may be a ``double precision`` (whose division is
Spark's), so a quotient with such an operand stays Spark's ``/``: pass
``column_types`` (every refresh does).

Integer casts.  PostgreSQL rounds when converting to an integer type
(``numeric`` half away from zero, ``double precision`` half to even); Spark
truncates.  Casts to ``smallint``/``integer``/``bigint`` therefore go through
``ROUND`` (numeric) or ``BROUND`` (floating point) first, with a ``typeof``
test when the operand type is unknown.  ``round(double precision)`` likewise
becomes ``BROUND``.

NULL ordering.  PostgreSQL sorts NULLs last in ascending and first in
descending order; Spark does the opposite.  Every sort key of every
``ORDER BY`` (query, window, ``string_agg``/``WITHIN GROUP``, ``DISTINCT
ON``) whose PostgreSQL NULL placement differs from Spark's default is
generated with an explicit ``NULLS LAST``/``NULLS FIRST`` (an explicit
``NULLS FIRST`` on an ascending key is Spark's default and stays implicit).

Other rewrites.  ``= ANY (ARRAY[...])`` / ``<> ALL (ARRAY[...])`` become
``IN``/``NOT IN`` lists (other operators become ``OR``/``AND`` chains, with the
same three-valued logic); ``= ANY (subquery)`` becomes ``IN (subquery)``.
``concat``/``concat_ws`` skip NULLs as in PostgreSQL; ``||`` propagates
NULLs in both engines.  ``log(x)`` is base 10 in PostgreSQL (``LOG10``);
``trunc`` truncates toward zero; ``substring``/``left``/``right`` with
non-positive positions or negative lengths follow PostgreSQL's rules;
``extract(dow ...)`` is shifted to PostgreSQL's 0 = Sunday and ``epoch`` is
computed from ``unix_micros``; regular expressions get ``(?s)`` so ``.``
matches newlines as in PostgreSQL, and ``regexp_replace`` without the ``g``
flag replaces only the first match; ``SELECT DISTINCT ON`` becomes a
``ROW_NUMBER()`` filter; interval constants become ``make_interval``;
``varchar(n)`` casts truncate; ``date - date`` is ``DATEDIFF``;
``date + interval`` is a timestamp; ``percentile_cont``/``percentile_disc``
stay exact (sqlglot would make them approximate); ``concat`` prints
booleans as ``t``/``f``.  Constructs that cannot be reproduced are refused
with a reason (see :func:`unsupported_reason`): ``WITH RECURSIVE``,
``LATERAL``, ``FOR UPDATE``, set-returning functions, arrays, JSON,
``AT TIME ZONE``, functions without a Spark equivalent...  ``character(n)``
values are carried without their trailing blanks (``sql/blank_padded.py``):
casts to it drop them, and ``LIKE``, regular expressions, ``octet_length``
and ``concat`` see the value padded back.  CTEs whose names clash across
nesting levels are renamed apart (``sql/ctes.py``), since the Spark text has
every CTE at its top.

Assumptions about the Spark session: ANSI mode on (the Spark 4 default);
timestamps of both kinds are Spark ``TIMESTAMP`` values and the session time
zone equals PostgreSQL's ``TimeZone`` (``date_trunc``, ``extract``,
``::date`` and ``epoch`` depend on it).  Queries whose Spark text would
contain ``${`` are refused because Spark substitutes variables there.

Known differences left as they are: text comparison and ``min``/``max``/
``ORDER BY`` on text follow code point order, which equals PostgreSQL's only
under the ``C`` collation; floating-point functions (``sqrt``, ``power``,
``stddev``...) and ``avg`` of floating-point values agree only up to
floating-point precision;
``double precision`` values print differently as text (``1e+20`` versus
``1.0E20``); a decimal printed as text shows its Spark scale, so values of
unconstrained ``numeric`` columns (read as ``DECIMAL(38, 18)``) print with
trailing zeros; ``double precision`` values of 1e20 or more cast to
``numeric`` overflow ``DECIMAL(38, 18)`` and fail.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp
from sqlglot.errors import ErrorLevel, SqlglotError, UnsupportedError

from pgtrickle.errors import UnsupportedQueryError
from pgtrickle.sql.ctes import rename_clashing_ctes
from pgtrickle.sql.functions import set_returning_function, volatile_function
from pgtrickle.sql.nodes import FROM_KEY, WRITE
from pgtrickle.sql.parse import base_tables, parse_query, qualified_name, referenced_tables, replace_tables
from pgtrickle.sql.rewrite_expressions import Rewriter
from pgtrickle.sql.rewrite_query import rewrite_distinct_on, rewrite_quantified
from pgtrickle.sql.support import find_unsupported, is_correlated, unsupported_reason
from pgtrickle.sql.type_inference import TypeInference

__all__ = [
    "expression_type",
    "is_correlated",
    "is_volatile",
    "parse_query",
    "referenced_tables",
    "set_returning_function",
    "translate_expression",
    "translate_to_spark",
    "unsupported_reason",
    "volatile_function",
]


def is_volatile(pg_sql: str) -> bool:
    """Tell whether the query's result can change although its sources did not.

    True when the query calls ``now()``/``current_timestamp``/``current_date``
    and friends, ``clock_timestamp()``, ``random()``, ``nextval()``,
    ``gen_random_uuid()`` and similar functions.

    Raises:
        UnsupportedQueryError: the text is not a single parseable query.
    """
    return volatile_function(parse_query(pg_sql)) is not None


def translate_to_spark(
    pg_sql: str,
    table_map: Mapping[tuple[str, str], str],
    column_types: Mapping[tuple[str, str], Mapping[str, str]] | None = None,
) -> str:
    """Translate a PostgreSQL defining query into Spark SQL with the same result.

    Args:
        pg_sql: the normalised PostgreSQL query text (see the module docs).
        table_map: for every ``(schema, table)`` the query reads (see
            :func:`referenced_tables`), the name of the Spark temporary view
            holding that table's rows.  Every reference is replaced by its
            view; references keep their alias, and a table without an alias
            is aliased with its own table name so that qualified column
            references such as ``orders.amount`` keep working.
        column_types: optional PostgreSQL (``format_type`` style, e.g.
            ``"integer"``, ``"numeric(12,2)"``, ``"timestamp with time
            zone"``) or Spark (``"int"``, ``"decimal(38,18)"``) type names of
            the source columns, keyed like ``table_map`` and then by column
            name.  With them integer division, integer casts, ``round`` and
            date arithmetic are decided when translating instead of by a
            run-time ``typeof`` test; see the module docs.

    Returns:
        Spark SQL text for ``SparkSession.sql``.

    Raises:
        UnsupportedQueryError: the query cannot run on Spark (the message is
            :func:`unsupported_reason`), or a table it reads has no entry in
            ``table_map``.
    """
    query = parse_query(pg_sql)
    reason = find_unsupported(query)
    if reason is not None:
        raise UnsupportedQueryError(reason)
    missing = [key for key, _ in base_tables(query) if key not in table_map]
    if missing:
        schema, table = missing[0]
        raise UnsupportedQueryError(f"no Spark view was given for table {qualified_name(schema, table)}")

    renamed = rename_clashing_ctes(rewrite_quantified(query))
    assert isinstance(renamed, exp.Query), "renaming CTEs keeps the query a query"
    query = renamed
    TypeInference(query, column_types or {}).annotate()
    rewritten = Rewriter().rewrite(query)
    assert isinstance(rewritten, exp.Query), "a rewrite replaces expressions inside the query, not the query"
    query = rewrite_distinct_on(rewritten)
    replace_tables(query, table_map)
    try:
        spark_sql = query.sql(dialect=WRITE, pretty=True, unsupported_level=ErrorLevel.RAISE)
    except (UnsupportedError, SqlglotError) as err:
        raise UnsupportedQueryError(f"the query cannot be expressed in Spark SQL: {err}") from err
    if "${" in spark_sql:
        raise UnsupportedQueryError(
            "the query contains '${', which Spark SQL would treat as a variable reference and substitute"
        )
    return spark_sql


_EXPRESSION_INPUT = ("pgt_ir", "input")


"""The stand-in relation an expression's columns are read from while it is translated alone."""


def _expression_select(expression: exp.Expr) -> exp.Select:
    """``SELECT <expression> FROM <stand-in>``: the query form the rewriting works on."""
    schema, table = _EXPRESSION_INPUT
    source = exp.Table(this=exp.to_identifier(table, quoted=True), db=exp.to_identifier(schema, quoted=True))
    select = exp.Select(expressions=[expression.copy()])
    select.set(FROM_KEY, exp.From(this=source))
    return select


def expression_type(expression: exp.Expr, column_types: Mapping[str, str]) -> str | None:
    """The PostgreSQL type category (``"int4"``, ``"numeric"``, ``"text"``, ...) of one expression.

    ``expression`` is a PostgreSQL expression whose unqualified columns are named in
    ``column_types`` (column name -> type name or category); ``None`` when unknown.
    """
    select = _expression_select(expression)
    return TypeInference(select, {_EXPRESSION_INPUT: column_types}).type_of(select.expressions[0])


def translate_expression(expression: exp.Expr, column_types: Mapping[str, str]) -> exp.Expr:
    """Translate one PostgreSQL expression (a predicate, a projection, an aggregate or window
    call) over the unqualified columns named in ``column_types`` into a Spark expression with
    the same result, by the rules :func:`translate_to_spark` applies to a whole query.

    Raises:
        UnsupportedQueryError: the expression holds a construct Spark cannot run.
    """
    select = _expression_select(expression)
    reason = find_unsupported(select)
    if reason is not None:
        raise UnsupportedQueryError(reason)
    select = rewrite_quantified(select)  # type: ignore[assignment]
    TypeInference(select, {_EXPRESSION_INPUT: column_types}).annotate()
    select = Rewriter().rewrite(select)  # type: ignore[assignment]
    return select.expressions[0]
