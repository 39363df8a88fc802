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
decimals are exact in Spark as long as the result fits 38 digits.  Known
limitation: the *scale* of a numeric quotient differs (PostgreSQL keeps at
least 16 significant digits, Spark ``max(6, s1 + p2 + 1)`` digits), so
non-terminating decimal quotients such as ``1::numeric / 3`` differ in their
trailing digits; like ``avg``, that is left to the result-type handling.

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
``stddev``...) and ``avg`` agree only up to floating-point precision;
``double precision`` values print differently as text (``1e+20`` versus
``1.0E20``); a decimal printed as text shows its Spark scale, so values of
unconstrained ``numeric`` columns (read as ``DECIMAL(38, 18)``) print with
trailing zeros; ``double precision`` values of 1e20 or more cast to
``numeric`` overflow ``DECIMAL(38, 18)`` and fail.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ErrorLevel, ParseError, SqlglotError, TokenError, UnsupportedError
from sqlglot.optimizer.scope import Scope, traverse_scope
from sqlglot.tokens import TokenType

from pgtrickle.errors import UnsupportedQueryError
from pgtrickle.sql import blank_padded
from pgtrickle.sql.ctes import rename_clashing_ctes

__all__ = [
    "expression_type",
    "is_volatile",
    "parse_query",
    "referenced_tables",
    "set_returning_function",
    "translate_expression",
    "translate_to_spark",
    "unsupported_reason",
    "volatile_function",
]

_READ = "postgres"
_WRITE = "spark"

#: PostgreSQL type categories used by the type inference.
_INT_TYPES = ("int2", "int4", "int8")
_FLOAT_TYPES = ("float4", "float8")
_NUMBER_TYPES = (*_INT_TYPES, "numeric", *_FLOAT_TYPES)
_DECIMAL_FOR_INT = {"int2": 5, "int4": 10, "int8": 20}
_SPARK_INT_TYPENAMES = ("tinyint", "smallint", "int", "bigint")
_SPARK_FLOAT_TYPENAMES = ("float", "double")
_META_KEY = "pgt_type"
_INT_CONDITION_KEY = "pgt_int_condition"

#: Functions sqlglot does not model but Spark has with the same name and meaning.
_SPARK_SAME_FUNCTIONS = frozenset(
    {
        "octet_length",
        "every",
        "grouping",
        "make_date",
        "cot",
        "sinh",
        "cosh",
        "tanh",
        "asinh",
        "acosh",
        "atanh",
    }
)
#: Functions sqlglot does not model that have a direct Spark replacement.
_TIMESTAMP_FUNCTIONS = frozenset({"clock_timestamp", "statement_timestamp", "transaction_timestamp"})
_UUID_FUNCTIONS = frozenset({"uuid_generate_v4"})
_SEQUENCE_FUNCTIONS = frozenset({"nextval", "currval", "setval", "lastval"})
_SET_RETURNING_FUNCTIONS = frozenset(
    {
        "generate_series",
        "generate_subscripts",
        "unnest",
        "regexp_matches",
        "regexp_split_to_table",
        "json_each",
        "json_each_text",
        "jsonb_each",
        "jsonb_each_text",
        "json_array_elements",
        "json_array_elements_text",
        "jsonb_array_elements",
        "jsonb_array_elements_text",
        "json_object_keys",
        "jsonb_object_keys",
        "json_populate_recordset",
        "jsonb_populate_recordset",
        "json_to_recordset",
        "jsonb_to_recordset",
        "string_to_table",
        "pg_get_keywords",
    }
)
#: Names (lower case) of functions whose result changes between refreshes on its own.
_VOLATILE_FUNCTIONS = frozenset(
    {
        "now",
        "random",
        "random_normal",
        "setseed",
        "clock_timestamp",
        "statement_timestamp",
        "transaction_timestamp",
        "timeofday",
        "nextval",
        "currval",
        "setval",
        "lastval",
        "gen_random_uuid",
        "uuid_generate_v1",
        "uuid_generate_v1mc",
        "uuid_generate_v4",
        "txid_current",
        "txid_current_if_assigned",
        "pg_current_xact_id",
        "pg_current_xact_id_if_assigned",
        "age",
    }
)
_VOLATILE_NODES: tuple[type[exp.Expr], ...] = tuple(
    cls
    for cls in (
        getattr(exp, name, None)
        for name in (
            "CurrentTimestamp",
            "CurrentTimestampLTZ",
            "CurrentDate",
            "CurrentTime",
            "CurrentDatetime",
            "Localtimestamp",
            "Localtime",
            "Rand",
            "Randn",
            "Uuid",
        )
    )
    if isinstance(cls, type)
)

#: Typed sqlglot functions whose Spark translation has been checked.
_ALLOWED_FUNC_NAMES = [
    "Cast",
    "Case",
    "If",
    "Coalesce",
    "Nullif",
    "Greatest",
    "Least",
    "Exists",
    "And",
    "Or",
    "Xor",
    "Count",
    "Sum",
    "Avg",
    "Min",
    "Max",
    "LogicalAnd",
    "LogicalOr",
    "GroupConcat",
    "Stddev",
    "StddevSamp",
    "StddevPop",
    "Variance",
    "VariancePop",
    "Corr",
    "CovarPop",
    "CovarSamp",
    "BitwiseAndAgg",
    "BitwiseOrAgg",
    "BitwiseXorAgg",
    "PercentileCont",
    "PercentileDisc",
    "Mode",
    "AnyValue",
    "RowNumber",
    "Rank",
    "DenseRank",
    "PercentRank",
    "CumeDist",
    "Ntile",
    "Lag",
    "Lead",
    "FirstValue",
    "LastValue",
    "NthValue",
    "Abs",
    "Ceil",
    "Floor",
    "Round",
    "Trunc",
    "Sign",
    "Sqrt",
    "Cbrt",
    "Exp",
    "Ln",
    "Log",
    "Pow",
    "Pi",
    "Degrees",
    "Radians",
    "Sin",
    "Cos",
    "Tan",
    "Asin",
    "Acos",
    "Atan",
    "Atan2",
    "Cot",
    "Sinh",
    "Cosh",
    "Tanh",
    "Asinh",
    "Acosh",
    "Atanh",
    "WidthBucket",
    "Rand",
    "Length",
    "BitLength",
    "Lower",
    "Upper",
    "Trim",
    "Pad",
    "Left",
    "Right",
    "Repeat",
    "Replace",
    "Reverse",
    "SplitPart",
    "StrPosition",
    "Substring",
    "Translate",
    "Ascii",
    "Chr",
    "MD5",
    "Concat",
    "ConcatWs",
    "StartsWith",
    "RegexpReplace",
    "RegexpLike",
    "RegexpILike",
    "Levenshtein",
    "Extract",
    "TimestampTrunc",
    "DateTrunc",
    "CurrentTimestamp",
    "CurrentDate",
    "Localtimestamp",
    "TimeToStr",
    "StrToDate",
    "StrToTime",
    "UnixToTime",
    "TimestampFromParts",
    "Uuid",
    "Anonymous",
    "Array",
    "Collate",
    "Grouping",
]
_ALLOWED_FUNCS: tuple[type[exp.Expr], ...] = tuple(
    cls for cls in (getattr(exp, name, None) for name in _ALLOWED_FUNC_NAMES) if isinstance(cls, type)
)
_IDENTITY_FUNCS: dict[str, str] = {
    "CurrentUser": "current_user returns the Spark user, not the PostgreSQL role",
    "SessionUser": "session_user returns the Spark user, not the PostgreSQL role",
    "CurrentRole": "current_role returns the Spark user, not the PostgreSQL role",
    "CurrentDatabase": "current_database() has no meaning on Spark",
    "CurrentCatalog": "current_catalog has no meaning on Spark",
    "CurrentSchema": "current_schema has no meaning on Spark",
    "CurrentSchemas": "current_schemas() has no meaning on Spark",
    "CurrentVersion": "version() would report Spark's version, not PostgreSQL's",
}
_SPECIAL_FUNC_REASONS: dict[str, str] = {
    "ArrayAgg": "array_agg() builds arrays, which stream tables do not support",
    "Initcap": "initcap() capitalises differently on Spark (only after spaces)",
    "Format": "format() treats NULL arguments differently on Spark",
    "CurrentTime": "current_time/localtime have no Spark equivalent (Spark has no time type)",
    "Localtime": "current_time/localtime have no Spark equivalent (Spark has no time type)",
    "MakeInterval": "make_interval() with named arguments has no Spark equivalent",
    "Hex": "to_hex() formats negative numbers differently on Spark",
    "ToNumber": "to_number() formats have no Spark equivalent",
    "SHA2Digest": "sha256()/sha512() return bytea in PostgreSQL but hex text on Spark",
    "SHA2": "sha256()/sha512() return bytea in PostgreSQL but hex text on Spark",
    "DateBin": "date_bin() has no Spark equivalent",
    "StringToArray": "string_to_array() builds arrays, which stream tables do not support",
    "ArrayToString": "array_to_string() needs array values, which stream tables do not support",
    "Encode": "encode() has no exact Spark equivalent",
    "Decode": "decode() has no exact Spark equivalent",
}

#: ``extract`` fields: PostgreSQL name -> Spark field (rewritten ones handled separately).
_EXTRACT_FIELDS = {
    "year": "YEAR",
    "years": "YEAR",
    "month": "MONTH",
    "months": "MONTH",
    "mon": "MONTH",
    "day": "DAY",
    "days": "DAY",
    "hour": "HOUR",
    "hours": "HOUR",
    "minute": "MINUTE",
    "minutes": "MINUTE",
    "min": "MINUTE",
    "second": "SECOND",
    "seconds": "SECOND",
    "sec": "SECOND",
    "quarter": "QUARTER",
    "week": "WEEK",
    "weeks": "WEEK",
    "doy": "DOY",
    "isodow": "DOW_ISO",
    "isoyear": "YEAROFWEEK",
}
_EXTRACT_REWRITTEN = frozenset({"dow", "epoch", "milliseconds", "millisecond", "microseconds", "microsecond"})

#: ``date_trunc`` units: PostgreSQL name -> Spark unit.
_TRUNC_UNITS = {
    "microsecond": "MICROSECOND",
    "microseconds": "MICROSECOND",
    "millisecond": "MILLISECOND",
    "milliseconds": "MILLISECOND",
    "second": "SECOND",
    "seconds": "SECOND",
    "minute": "MINUTE",
    "minutes": "MINUTE",
    "hour": "HOUR",
    "hours": "HOUR",
    "day": "DAY",
    "days": "DAY",
    "week": "WEEK",
    "weeks": "WEEK",
    "month": "MONTH",
    "months": "MONTH",
    "quarter": "QUARTER",
    "year": "YEAR",
    "years": "YEAR",
}

#: strftime tokens (sqlglot's form of PostgreSQL ``to_char`` patterns) Spark formats identically.
_SAFE_TIME_TOKENS = frozenset({"%Y", "%y", "%m", "%d", "%H", "%M", "%S", "%j", "%f"})
#: Regular-expression syntax PostgreSQL supports but Java does not (or reads differently).
_PG_ONLY_REGEX = re.compile(r"\[\[[:.=]|\\[mMyYZ]|\*\*\*")
_BACKREFERENCE = re.compile(r"\\[1-9]")
_INTERVAL_TOKEN = re.compile(
    r"\s*(?:(?P<num>[+-]?\d+(?:\.\d+)?)\s+"
    r"(?P<unit>years?|mons?|months?|weeks?|days?|hours?|mins?|minutes?|secs?|seconds?)\b"
    r"|(?P<sign>[+-])?(?P<h>\d+):(?P<m>\d{2}):(?P<s>\d{2}(?:\.\d+)?))",
)


#: Blank-padded ``character(n)`` types, whose comparison semantics Spark does not have.
_BLANK_PADDED = frozenset(getattr(exp.DType, n) for n in ("CHAR", "NCHAR", "BPCHAR") if hasattr(exp.DType, n))
#: Name of the FROM argument of sqlglot's Select (renamed in recent versions).
_FROM_KEY = "from_" if "from_" in exp.Select.arg_types else "from"
#: Operators that may have ``ANY (...)``/``ALL (...)`` on their right.
_QUANTIFIED_PARENTS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Like, exp.ILike)
#: PostgreSQL names of the functions sqlglot models as its own classes (set-returning and ``random``).
_PG_FUNCTION_NAMES = {
    "ExplodingGenerateSeries": "generate_series",
    "GenerateSeries": "generate_series",
    "Explode": "unnest",
    "Unnest": "unnest",
    "Posexplode": "unnest",
    "Rand": "random",
}


# --------------------------------------------------------------------------- public API


def parse_query(pg_sql: str) -> exp.Query:
    """Parse PostgreSQL query text into a sqlglot query expression.

    The text may end with semicolons.  It must contain exactly one
    ``SELECT`` or set-operation (``UNION``/``INTERSECT``/``EXCEPT``) query,
    optionally with a ``WITH`` clause.

    Raises:
        UnsupportedQueryError: the text cannot be parsed, holds several
            statements, or is not a query (for example an ``INSERT``).
    """
    text = pg_sql.strip()
    while text.endswith(";"):
        text = text[:-1].rstrip()
    if not text:
        raise UnsupportedQueryError("the defining query is empty")
    try:
        statements = [s for s in sqlglot.parse(_normalise_tokens(text), read=_READ) if s is not None]
    except (ParseError, TokenError) as err:
        raise UnsupportedQueryError(
            f"the defining query could not be parsed as PostgreSQL SQL: {err}"
        ) from err
    if len(statements) != 1:
        raise UnsupportedQueryError(f"the defining query must be a single statement, found {len(statements)}")
    statement = statements[0]
    while isinstance(statement, exp.Subquery) and not statement.alias:
        statement = statement.this
    if not isinstance(statement, (exp.Select, exp.SetOperation)):
        raise UnsupportedQueryError(
            f"the defining query must be a SELECT query, found {_describe_statement(statement)}"
        )
    if isinstance(statement, exp.Select) and statement.args.get("into"):
        raise UnsupportedQueryError("the defining query must be a SELECT query, found SELECT ... INTO")
    return statement


def referenced_tables(pg_sql: str) -> list[tuple[str, str]]:
    """Return the distinct ``(schema, table)`` pairs the query reads.

    Pairs are in order of first appearance in the text; names of common table
    expressions are not tables and are left out.  Names are spelled exactly
    as PostgreSQL spells them (unquoted names are lower case in the
    normalised text, quoted names keep their case).  A table written without
    a schema is in ``pg_catalog`` (the normalised text qualifies everything
    else).

    Raises:
        UnsupportedQueryError: the text is not a single parseable query.
    """
    query = parse_query(pg_sql)
    result: list[tuple[str, str]] = []
    for key, _table in _base_tables(query):
        if key not in result:
            result.append(key)
    return result


def unsupported_reason(pg_sql: str) -> str | None:
    """Explain why the query cannot run on Spark, or return ``None`` if it can.

    The reason names the construct, for example ``WITH RECURSIVE``,
    ``FOR UPDATE``, ``LATERAL``, a set-returning function such as
    ``generate_series()``, or a function without a Spark equivalent.  A
    query that cannot be parsed is reported the same way.
    """
    try:
        query = parse_query(pg_sql)
    except UnsupportedQueryError as err:
        return str(err)
    return _find_unsupported(query)


def is_correlated(subquery: exp.Select) -> bool:
    """Whether ``subquery`` refers to a column of a table outside it (an outer query's)."""
    own = {t.alias_or_name for t in subquery.find_all(exp.Table)}
    return any(c.table and c.table not in own for c in subquery.find_all(exp.Column))


def is_volatile(pg_sql: str) -> bool:
    """Tell whether the query's result can change although its sources did not.

    True when the query calls ``now()``/``current_timestamp``/``current_date``
    and friends, ``clock_timestamp()``, ``random()``, ``nextval()``,
    ``gen_random_uuid()`` and similar functions.

    Raises:
        UnsupportedQueryError: the text is not a single parseable query.
    """
    return volatile_function(parse_query(pg_sql)) is not None


def volatile_function(tree: exp.Expr) -> str | None:
    """The name of the first volatile function (see :func:`is_volatile`) a parsed query calls, or ``None``."""
    for node in tree.walk():
        if isinstance(node, _VOLATILE_NODES):
            return _function_name(node)
        if isinstance(node, exp.Anonymous) and node.name.lower() in _VOLATILE_FUNCTIONS:
            return node.name.lower()
    return None


def set_returning_function(node: exp.Expr) -> str | None:
    """The PostgreSQL name of ``node`` when it is a set-returning function call (``generate_series``...)."""
    if isinstance(node, exp.Func):
        name = _function_name(node)
        if name.lower() in _SET_RETURNING_FUNCTIONS:
            return name.lower()
    return None


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
    reason = _find_unsupported(query)
    if reason is not None:
        raise UnsupportedQueryError(reason)
    missing = [key for key, _ in _base_tables(query) if key not in table_map]
    if missing:
        schema, table = missing[0]
        raise UnsupportedQueryError(f"no Spark view was given for table {_qualified_name(schema, table)}")

    renamed = rename_clashing_ctes(_rewrite_quantified(query))
    assert isinstance(renamed, exp.Query), "renaming CTEs keeps the query a query"
    query = renamed
    _TypeInference(query, column_types or {}).annotate()
    rewritten = _Rewriter().rewrite(query)
    assert isinstance(rewritten, exp.Query), "a rewrite replaces expressions inside the query, not the query"
    query = _rewrite_distinct_on(rewritten)
    _replace_tables(query, table_map)
    try:
        spark_sql = query.sql(dialect=_WRITE, pretty=True, unsupported_level=ErrorLevel.RAISE)
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
    select.set(_FROM_KEY, exp.From(this=source))
    return select


def expression_type(expression: exp.Expr, column_types: Mapping[str, str]) -> str | None:
    """The PostgreSQL type category (``"int4"``, ``"numeric"``, ``"text"``, ...) of one expression.

    ``expression`` is a PostgreSQL expression whose unqualified columns are named in
    ``column_types`` (column name -> type name or category); ``None`` when unknown.
    """
    select = _expression_select(expression)
    return _TypeInference(select, {_EXPRESSION_INPUT: column_types}).type_of(select.expressions[0])


def translate_expression(expression: exp.Expr, column_types: Mapping[str, str]) -> exp.Expr:
    """Translate one PostgreSQL expression (a predicate, a projection, an aggregate or window
    call) over the unqualified columns named in ``column_types`` into a Spark expression with
    the same result, by the rules :func:`translate_to_spark` applies to a whole query.

    Raises:
        UnsupportedQueryError: the expression holds a construct Spark cannot run.
    """
    select = _expression_select(expression)
    reason = _find_unsupported(select)
    if reason is not None:
        raise UnsupportedQueryError(reason)
    select = _rewrite_quantified(select)  # type: ignore[assignment]
    _TypeInference(select, {_EXPRESSION_INPUT: column_types}).annotate()
    select = _Rewriter().rewrite(select)  # type: ignore[assignment]
    return select.expressions[0]


# --------------------------------------------------------------------------- parsing helpers


def _normalise_tokens(text: str) -> str:
    """Apply token-level fixes before parsing.

    * ``'literal'::text`` and ``'literal'::character varying`` lose their cast:
      a string literal already is a Spark string, and sqlglot's function
      builders (``to_char``, ``date_trunc``, ``date_part``) only understand
      plain literal arguments.
    * ``"position"(string, substring)`` (PostgreSQL's function-call form) is
      renamed ``strpos``, which has the same argument order; sqlglot would
      otherwise read the arguments the other way round.
    """
    try:
        tokens = sqlglot.Dialect.get_or_raise(_READ).tokenize(text)
    except TokenError as err:
        raise UnsupportedQueryError(
            f"the defining query could not be parsed as PostgreSQL SQL: {err}"
        ) from err
    edits: list[tuple[int, int, str]] = []
    count = len(tokens)
    for i, token in enumerate(tokens):
        following = tokens[i + 1] if i + 1 < count else None
        if (
            token.token_type == TokenType.IDENTIFIER
            and token.text == "position"
            and following is not None
            and following.token_type == TokenType.L_PAREN
        ):
            edits.append((token.start, token.end, "strpos"))
        elif (
            token.token_type == TokenType.STRING
            and following is not None
            and following.token_type == TokenType.DCOLON
            and i + 2 < count
            and tokens[i + 2].token_type in (TokenType.TEXT, TokenType.VARCHAR)
            and not (i + 3 < count and tokens[i + 3].token_type in (TokenType.L_PAREN, TokenType.L_BRACKET))
        ):
            edits.append((following.start, tokens[i + 2].end, ""))
    for start, end, replacement in reversed(edits):
        text = text[:start] + replacement + text[end + 1 :]
    return text


def _describe_statement(statement: exp.Expr) -> str:
    """Name a non-query statement for error messages."""
    if isinstance(statement, exp.Command):
        return str(statement.this).upper()
    return statement.key.upper()


def _qualified_name(schema: str, table: str) -> str:
    """Render ``schema.table`` the way PostgreSQL would quote it."""
    return ".".join(exp.to_identifier(part).sql(dialect=_READ) for part in (schema, table))


# --------------------------------------------------------------------------- tables


def _cte_names(query: exp.Expr) -> set[str]:
    """Names of every common table expression defined anywhere in the query."""
    return {cte.alias_or_name for cte in query.find_all(exp.CTE)}


def _base_tables(query: exp.Expr) -> list[tuple[tuple[str, str], exp.Table]]:
    """Every reference to a real table, as ``((schema, table), node)`` in text order."""
    ctes = _cte_names(query)
    found: list[tuple[int, int, tuple[str, str], exp.Table]] = []
    for index, table in enumerate(query.find_all(exp.Table, bfs=False)):
        if not isinstance(table.this, exp.Identifier) or isinstance(table.parent, exp.Lock):
            continue
        schema = table.text("db")
        if not schema:
            if table.name in ctes:
                continue
            schema = "pg_catalog"
        start = table.this.meta.get("start")
        found.append((start if isinstance(start, int) else 1 << 62, index, (schema, table.name), table))
    found.sort(key=lambda item: (item[0], item[1]))
    return [(key, table) for _, _, key, table in found]


def _replace_tables(query: exp.Expr, table_map: Mapping[tuple[str, str], str]) -> None:
    """Point every table reference at its Spark view, keeping (or adding) the alias."""
    for key, table in _base_tables(query):
        original = table.this
        view = table_map[key]
        if not table.alias:
            table.set("alias", exp.TableAlias(this=exp.to_identifier(original.name, quoted=original.quoted)))
        table.set("this", exp.to_identifier(view))
        table.set("db", None)
        table.set("catalog", None)


# --------------------------------------------------------------------------- unsupported constructs


def _find_unsupported(query: exp.Expr) -> str | None:
    """Return the reason of the first construct Spark cannot run, if any."""
    for node in query.walk():
        reason = _node_reason(node)
        if reason is not None:
            return reason
    return None


def _grouped_correlated_reason(select: exp.Select) -> str | None:
    """Spark refuses a correlated scalar subquery in the output list of a grouped SELECT."""
    grouped = select.args.get("group") is not None or any(
        agg.find_ancestor(exp.Select) is select
        for node in select.expressions
        for agg in node.find_all(exp.AggFunc)
    )
    if not grouped:
        return None
    for node in select.expressions:
        for sub in node.find_all(exp.Subquery):
            if (
                sub.alias
                or not isinstance(sub.this, exp.Select)
                or sub.find_ancestor(exp.Select) is not select
            ):
                continue
            if is_correlated(sub.this):
                return (
                    "a correlated scalar subquery in the output list of a GROUP BY query is not supported "
                    "on Spark; group in a derived table first: SELECT g.k, g.n, (SELECT ... WHERE b.k = g.k) "
                    "FROM (SELECT k, count(*) AS n FROM a GROUP BY k) g"
                )
    return None


def _node_reason(node: exp.Expr) -> str | None:
    """Return why ``node`` cannot be translated, or ``None``."""
    if isinstance(node, exp.With) and node.args.get("recursive"):
        return "WITH RECURSIVE (recursive common table expressions) is not supported on Spark"
    if isinstance(node, exp.Select):
        if node.args.get("locks"):
            return "FOR UPDATE / FOR SHARE row locking is not supported in a stream table query"
        if node.args.get("into"):
            return "SELECT ... INTO is not a query"
        return _grouped_correlated_reason(node)
    if isinstance(node, exp.Lateral) or (
        isinstance(node, (exp.Subquery, exp.Table, exp.Join)) and node.args.get("lateral")
    ):
        return "LATERAL subqueries and functions are not supported on Spark"
    if isinstance(node, exp.TableSample):
        return "TABLESAMPLE is not supported in a stream table query"
    if isinstance(node, exp.Table):
        return _table_reason(node)
    if isinstance(node, (exp.Any, exp.All)):
        return _quantified_reason(node, node.this, "ANY" if isinstance(node, exp.Any) else "ALL")
    if isinstance(node, exp.Anonymous) and node.name.upper() in ("ANY", "ALL") and len(node.expressions) == 1:
        return _quantified_reason(node, node.expressions[0], node.name.upper())
    if isinstance(node, exp.Array):
        if _inside_quantified_array(node):
            return None
        return "array values (ARRAY[...]) are not supported"
    if isinstance(node, exp.Cast):
        return _cast_reason(node)
    if isinstance(node, exp.AtTimeZone):
        return "AT TIME ZONE is not supported (time zone conversion differs on Spark)"
    if isinstance(node, exp.Bracket):
        return "array subscripts are not supported"
    if isinstance(node, exp.Placeholder):
        return "query parameters are not supported in a stream table query"
    if isinstance(node, exp.WindowSpec):
        if str(node.args.get("kind") or "").upper() == "GROUPS":
            return "window frames in GROUPS mode are not supported on Spark"
        if node.args.get("exclude"):
            return "window frame EXCLUDE clauses are not supported on Spark"
        return None
    if isinstance(node, exp.WithinGroup):
        if isinstance(node.this, (exp.PercentileCont, exp.PercentileDisc, exp.Mode)):
            return None
        return (
            f"the ordered-set aggregate {_function_name(node.this)}() WITHIN GROUP is not supported on Spark"
        )
    if isinstance(node, exp.Collate):
        collation = node.expression.name if isinstance(node.expression, exp.Expr) else str(node.expression)
        if collation.lower() in ("c", "posix", "default", "pg_catalog.c"):
            return None
        return f'COLLATE "{collation}" is not supported (Spark compares text by code point, like COLLATE "C")'
    if isinstance(node, exp.Func):
        return _function_reason(node)
    return None


def _table_reason(table: exp.Table) -> str | None:
    """Reasons tied to a FROM item."""
    if not isinstance(table.this, exp.Identifier):
        name = _function_name(table.this) if isinstance(table.this, exp.Expr) else str(table.this)
        if name.lower() in _SET_RETURNING_FUNCTIONS:
            return f"the set-returning function {name}() is not supported"
        return f"functions in FROM ({name}()) are not supported"
    if table.args.get("only"):
        return "FROM ONLY (excluding inheritance children) is not supported"
    if table.args.get("sample"):
        return "TABLESAMPLE is not supported in a stream table query"
    return None


def _array_elements(operand: exp.Expr) -> list[exp.Expr] | None:
    """Elements of an ``ARRAY[...]`` constructor, possibly parenthesised and cast to an array type."""
    node = operand
    while True:
        if isinstance(node, exp.Paren) or (isinstance(node, exp.Cast) and node.to.is_type(exp.DType.ARRAY)):
            node = node.this
        else:
            break
    if isinstance(node, exp.Array):
        return list(node.expressions)
    return None


def _subquery_operand(operand: exp.Expr) -> exp.Query | None:
    """The query of a quantified comparison's subquery operand, if it is one."""
    node = operand
    while isinstance(node, (exp.Paren, exp.Subquery)) and not (isinstance(node, exp.Subquery) and node.alias):
        node = node.this
    return node if isinstance(node, (exp.Select, exp.SetOperation)) else None


def _quantified_reason(node: exp.Expr, operand: exp.Expr, quantifier: str) -> str | None:
    """Reasons for ``x op ANY/ALL (...)``."""
    parent = node.parent
    if not isinstance(parent, _QUANTIFIED_PARENTS) or parent.expression is not node:
        return f"{quantifier} (...) is only supported on the right of a comparison or LIKE"
    if _array_elements(operand) is not None:
        return None
    if _subquery_operand(operand) is not None:
        if isinstance(parent, exp.EQ if quantifier == "ANY" else exp.NEQ):
            return None
        return (
            f"comparisons with {quantifier} (subquery) other than = ANY and <> ALL are not supported on Spark"
        )
    return f"{quantifier} over an array value (rather than an ARRAY[...] list) is not supported"


def _inside_quantified_array(node: exp.Expr) -> bool:
    """Whether an ``ARRAY[...]`` is the operand of ``ANY``/``ALL``."""
    parent = node.parent
    while isinstance(parent, (exp.Paren, exp.Cast)):
        parent = parent.parent
    if isinstance(parent, (exp.Any, exp.All)):
        return True
    return isinstance(parent, exp.Anonymous) and parent.name.upper() in ("ANY", "ALL")


def _cast_reason(cast: exp.Cast) -> str | None:
    """Reasons tied to a ``::type`` cast."""
    to = cast.to
    kind = to.this
    type_name = to.sql(dialect=_READ).lower()
    if kind == exp.DType.ARRAY:
        if _inside_quantified_array(cast) or isinstance(cast.parent, (exp.Any, exp.All)):
            return None
        if isinstance(cast.parent, exp.Anonymous) and cast.parent.name.upper() in ("ANY", "ALL"):
            return None
        return f"casts to the array type {type_name} are not supported"
    if kind in _BLANK_PADDED:
        return None  # carried without trailing blanks (sql/blank_padded.py)
    if kind in (exp.DType.TEXT, exp.DType.VARCHAR, exp.DType.NVARCHAR, exp.DType.NAME, exp.DType.UUID):
        return None
    if kind in (exp.DType.SMALLINT, exp.DType.INT, exp.DType.BIGINT, exp.DType.DOUBLE, exp.DType.FLOAT):
        return None
    if kind in (exp.DType.BOOLEAN, exp.DType.DATE):
        return None
    if kind == exp.DType.DECIMAL:
        params = _type_params(to)
        if params and (params[0] > 38 or (len(params) > 1 and not 0 <= params[1] <= params[0])):
            return f"casts to {type_name} are not supported (Spark decimals have at most 38 digits)"
        if (
            not params
            and (literal := _literal_decimal(cast.this)) is not None
            and _decimal_shape(literal)[0] > 38
        ):
            return f"the numeric constant {literal} has more than 38 digits, which Spark cannot hold"
        return None
    if kind in (exp.DType.TIMESTAMP, exp.DType.TIMESTAMPTZ):
        params = _type_params(to)
        if params and params[0] < 6:
            return f"casts to {type_name} are not supported (Spark does not round timestamps to a precision)"
        return None
    if kind == exp.DType.INTERVAL:
        value = cast.this
        if isinstance(value, exp.Literal) and value.is_string and _parse_interval(value.this) is not None:
            return None
        return "intervals are only supported as constants such as '1 day'::interval"
    return f"casts to {type_name} are not supported on Spark"


def _function_name(node: exp.Expr) -> str:
    """The SQL name of a function node, for messages."""
    if type(node).__name__ in _PG_FUNCTION_NAMES:
        return _PG_FUNCTION_NAMES[type(node).__name__]
    if isinstance(node, exp.Anonymous):
        return node.name
    if isinstance(node, exp.Func):
        try:
            return type(node).sql_name().lower()
        except (AssertionError, NotImplementedError):
            return type(node).__name__.lower()
    return node.sql(dialect=_READ)


def _function_reason(node: exp.Func) -> str | None:
    """Reasons tied to a function call."""
    cls_name = type(node).__name__
    if isinstance(node, exp.Anonymous):
        name = node.name.lower()
        if name in ("any", "all"):
            return None
        if name in _SEQUENCE_FUNCTIONS:
            return f"the sequence function {name}() changes PostgreSQL state and cannot run on Spark"
        if name in _SET_RETURNING_FUNCTIONS:
            return f"the set-returning function {name}() is not supported"
        if name in _SPARK_SAME_FUNCTIONS or name in _TIMESTAMP_FUNCTIONS or name in _UUID_FUNCTIONS:
            return None
        return f"the function {node.name}() has no Spark equivalent"
    if cls_name in _IDENTITY_FUNCS:
        return _IDENTITY_FUNCS[cls_name]
    if cls_name in _SPECIAL_FUNC_REASONS:
        return _SPECIAL_FUNC_REASONS[cls_name]
    if cls_name.upper().startswith("JSON") or "JSON" in cls_name.upper():
        return "JSON operators and functions are not supported on Spark"
    if _function_name(node).lower() in _SET_RETURNING_FUNCTIONS:
        return f"the set-returning function {_function_name(node)}() is not supported"
    if not isinstance(node, _ALLOWED_FUNCS):
        return f"the function {_function_name(node)}() has no Spark equivalent"
    if isinstance(node, exp.Extract):
        field = _extract_field(node)
        if field not in _EXTRACT_FIELDS and field not in _EXTRACT_REWRITTEN:
            return f"extract({field} ...) has no Spark equivalent"
        return None
    if isinstance(node, (exp.TimestampTrunc, exp.DateTrunc)):
        unit = _unit_name(node.args.get("unit"))
        if node.args.get("zone") is not None:
            return "date_trunc() with a time zone argument has no Spark equivalent"
        if unit not in _TRUNC_UNITS:
            return f"date_trunc('{unit}', ...) has no Spark equivalent"
        return None
    if isinstance(node, (exp.RegexpLike, exp.RegexpILike)):
        return _regex_pattern_reason(node.expression)
    if isinstance(node, exp.RegexpReplace):
        return _regexp_replace_reason(node)
    if isinstance(node, (exp.TimeToStr, exp.StrToDate, exp.StrToTime)):
        return _time_format_reason(node)
    if isinstance(node, exp.Chr):
        arg = node.expressions[0] if node.expressions else node.this
        if isinstance(arg, exp.Literal) and not arg.is_string and arg.this.isdigit() and int(arg.this) < 128:
            return None
        return "chr() is only supported for constant ASCII codes (Spark's chr() works modulo 256)"
    if isinstance(node, exp.Array):
        return None if _inside_quantified_array(node) else "array values (ARRAY[...]) are not supported"
    if cls_name == "Grouping" and len(node.expressions) != 1:
        return "grouping() with several arguments is not supported on Spark (use one argument per call)"
    return None


def _regex_pattern_reason(pattern: exp.Expr | None) -> str | None:
    """Refuse regular expressions using PostgreSQL-only syntax."""
    if isinstance(pattern, exp.Literal) and pattern.is_string and _PG_ONLY_REGEX.search(pattern.this):
        return (
            f"the regular expression '{pattern.this}' uses PostgreSQL-only syntax "
            "(POSIX classes, \\m, \\M, \\y, \\Y, \\Z or ***) that Spark reads differently"
        )
    return None


def _regexp_replace_reason(node: exp.RegexpReplace) -> str | None:
    """Which ``regexp_replace`` calls can be reproduced."""
    if node.args.get("position") is not None or node.args.get("occurrence") is not None:
        return "regexp_replace() with start or occurrence arguments has no Spark equivalent"
    flags = _regexp_flags(node)
    if flags is None or set(flags) - {"g", "i"}:
        return "regexp_replace() is only supported with the flags 'g' and 'i'"
    pattern_reason = _regex_pattern_reason(node.expression)
    if pattern_reason:
        return pattern_reason
    replacement = node.args.get("replacement")
    if not (isinstance(replacement, exp.Literal) and replacement.is_string):
        return "regexp_replace() needs a constant replacement text to be translated"
    if _java_replacement(replacement.this, 0, "$0") is None:
        return "regexp_replace() replacement text uses escapes other than \\1-\\9, \\& and \\\\"
    if "g" not in flags:
        pattern = node.expression
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            return "regexp_replace() without the 'g' flag needs a constant pattern to be translated"
        if _BACKREFERENCE.search(pattern.this):
            return "regexp_replace() without the 'g' flag cannot use back-references in the pattern"
    return None


def _regexp_flags(node: exp.RegexpReplace) -> str | None:
    """The flags of a ``regexp_replace`` call ('' when none), or None when not constant."""
    modifiers = node.args.get("modifiers")
    if modifiers is None:
        return ""
    if isinstance(modifiers, exp.Literal) and modifiers.is_string:
        return modifiers.this
    return None


def _time_format_reason(node: exp.Func) -> str | None:
    """Only date/time formats that Spark renders identically are allowed."""
    name = {"TimeToStr": "to_char", "StrToDate": "to_date", "StrToTime": "to_timestamp"}[type(node).__name__]
    fmt = node.args.get("format")
    if not (isinstance(fmt, exp.Literal) and fmt.is_string):
        return f"{name}() needs a constant format to be translated"
    rest = re.sub(r"%-?[A-Za-z]", lambda m: "" if m.group(0) in _SAFE_TIME_TOKENS else "\0", fmt.this)
    if "\0" in rest or re.search(r"[A-Za-z0-9%\"'\\]", rest):
        return (
            f"the {name}() format uses patterns Spark does not reproduce "
            "(supported: YYYY, YY, MM, DD, DDD, HH24, MI, SS, US and punctuation)"
        )
    return None


# --------------------------------------------------------------------------- small helpers


def _type_params(datatype: exp.DataType) -> list[int]:
    """Integer type modifiers of a data type (``numeric(10, 2)`` -> ``[10, 2]``)."""
    params: list[int] = []
    for param in datatype.expressions:
        value = param.this if isinstance(param, exp.DataTypeParam) else param
        text = value.name if isinstance(value, exp.Expr) else str(value)
        try:
            params.append(int(text))
        except ValueError:
            return []
    return params


def _literal_decimal(node: exp.Expr) -> Decimal | None:
    """The value of a numeric constant (number, numeric string, or negated number)."""
    negate = False
    while isinstance(node, (exp.Paren, exp.Neg)):
        if isinstance(node, exp.Neg):
            negate = not negate
        node = node.this
    if not isinstance(node, exp.Literal):
        return None
    try:
        value = Decimal(node.this.strip())
    except (InvalidOperation, AttributeError):
        return None
    if not value.is_finite():
        return None
    return -value if negate else value


def _decimal_shape(value: Decimal) -> tuple[int, int]:
    """Smallest ``(precision, scale)`` holding ``value`` exactly."""
    _sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    scale = max(-exponent, 0)
    integer_digits = max(len(digits) + exponent, 0)
    return max(integer_digits + scale, 1), scale


def _decimal_type(precision: int, scale: int) -> exp.DataType:
    """A ``DECIMAL(precision, scale)`` data type."""
    return exp.DataType.build(f"DECIMAL({precision}, {scale})", dialect=_WRITE)


def _spark_type(name: str) -> exp.DataType:
    """A simple Spark data type by name."""
    return exp.DataType.build(name, dialect=_WRITE)


def _func(name: str, *args: exp.Expr) -> exp.Anonymous:
    """A Spark function call emitted verbatim."""
    return exp.Anonymous(this=name, expressions=list(args))


def _cast(node: exp.Expr, type_name: str) -> exp.Cast:
    """``CAST(node AS type_name)`` with a Spark type name."""
    return exp.Cast(this=node, to=_spark_type(type_name))


def _typeof_in(node: exp.Expr, names: Iterable[str]) -> exp.In:
    """``typeof(node) IN (names...)`` - a run-time type test on Spark."""
    return exp.In(this=_func("TYPEOF", node), expressions=[exp.Literal.string(n) for n in names])


def _paren(node: exp.Expr) -> exp.Paren:
    """Wrap an expression in parentheses."""
    return exp.Paren(this=node)


def _pg_type(node: exp.Expr | None) -> str | None:
    """The inferred PostgreSQL type category of a node (None when unknown)."""
    if node is None:
        return None
    value = node.meta.get(_META_KEY)
    return value if isinstance(value, str) else None


def _typed(node: exp.Expr, pg_type: str | None) -> exp.Expr:
    """Record the PostgreSQL type category of a node built by the rewriter."""
    node.meta[_META_KEY] = pg_type
    return node


def _is_string_literal(node: exp.Expr) -> bool:
    """Whether a node is a plain string constant."""
    return isinstance(node, exp.Literal) and node.is_string


def _extract_field(node: exp.Extract) -> str:
    """The lower-case field name of an ``extract``/``date_part`` call."""
    field = node.this
    while isinstance(field, (exp.Cast, exp.Paren)):
        field = field.this
    if isinstance(field, exp.Expr):
        return field.name.lower()
    return str(field).lower()


def _unit_name(unit: exp.Expr | None) -> str:
    """The lower-case unit of a ``date_trunc`` call."""
    while isinstance(unit, (exp.Cast, exp.Paren)):
        unit = unit.this
    if isinstance(unit, exp.Expr):
        return unit.name.lower()
    return str(unit or "").lower()


def _parse_interval(text: str) -> tuple[int, int, int, int, int, int, Decimal] | None:
    """Parse PostgreSQL interval text into make_interval arguments.

    Returns ``(years, months, weeks, days, hours, minutes, seconds)`` or None
    when the text is not in PostgreSQL's output format (``1 year 2 mons 3 days
    04:05:06.5``) or the plain unit form (``2 hours``).
    """
    values = {"year": 0, "mon": 0, "week": 0, "day": 0, "hour": 0, "min": 0}
    seconds = Decimal(0)
    position = 0
    text = text.strip().lower()
    if not text:
        return None
    while position < len(text):
        match = _INTERVAL_TOKEN.match(text, position)
        if match is None or match.end() == position:
            return None
        position = match.end()
        if match.group("num") is not None:
            number = Decimal(match.group("num"))
            unit = match.group("unit")
            if unit.startswith("sec"):
                seconds += number
                continue
            if number != number.to_integral_value():
                return None
            key = next(k for k in ("year", "mon", "week", "day", "hour", "min") if unit.startswith(k))
            values[key] += int(number)
        else:
            sign = -1 if match.group("sign") == "-" else 1
            values["hour"] += sign * int(match.group("h"))
            values["min"] += sign * int(match.group("m"))
            seconds += sign * Decimal(match.group("s"))
        while position < len(text) and text[position].isspace():
            position += 1
    return (
        values["year"],
        values["mon"],
        values["week"],
        values["day"],
        values["hour"],
        values["min"],
        seconds,
    )


def _java_replacement(replacement: str, group_shift: int, whole_match: str) -> str | None:
    """Convert a PostgreSQL ``regexp_replace`` replacement into Java syntax (None if impossible)."""
    out: list[str] = []
    i = 0
    while i < len(replacement):
        char = replacement[i]
        if char == "\\":
            if i + 1 >= len(replacement):
                return None
            following = replacement[i + 1]
            if following in "123456789":
                out.append(f"${int(following) + group_shift}")
            elif following == "&":
                out.append(whole_match)
            elif following == "\\":
                out.append("\\\\")
            else:
                return None
            i += 2
            continue
        out.append("\\$" if char == "$" else char)
        i += 1
    return "".join(out)


def _java_pattern(pattern: exp.Expr, flags: str) -> exp.Expr:
    """Prefix a regular expression with Java inline flags (``s`` always: ``.`` matches newlines)."""
    prefix = f"(?{flags}s)"
    if _is_string_literal(pattern):
        return exp.Literal.string(prefix + pattern.this)
    return _func("CONCAT", exp.Literal.string(prefix), pattern)


# --------------------------------------------------------------------------- types


def _category_from_datatype(datatype: exp.DataType) -> str | None:
    """Map a sqlglot data type (parsed as PostgreSQL) to a type category."""
    kind = datatype.this
    mapping = {
        exp.DType.SMALLINT: "int2",
        exp.DType.TINYINT: "int2",
        exp.DType.INT: "int4",
        exp.DType.BIGINT: "int8",
        exp.DType.DECIMAL: "numeric",
        exp.DType.MONEY: "numeric",
        exp.DType.FLOAT: "float4",
        exp.DType.DOUBLE: "float8",
        exp.DType.TEXT: "text",
        exp.DType.VARCHAR: "text",
        exp.DType.NVARCHAR: "text",
        exp.DType.CHAR: "text",
        exp.DType.NCHAR: "text",
        exp.DType.NAME: "text",
        exp.DType.BOOLEAN: "bool",
        exp.DType.DATE: "date",
        exp.DType.TIMESTAMP: "timestamp",
        exp.DType.TIMESTAMPTZ: "timestamptz",
        exp.DType.INTERVAL: "interval",
        exp.DType.UUID: "uuid",
    }
    return mapping.get(kind)


_TYPE_NAME_CATEGORIES = {
    "smallint": "int2",
    "int2": "int2",
    "tinyint": "int2",
    "byte": "int2",
    "short": "int2",
    "smallserial": "int2",
    "integer": "int4",
    "int": "int4",
    "int4": "int4",
    "serial": "int4",
    "bigint": "int8",
    "int8": "int8",
    "long": "int8",
    "bigserial": "int8",
    "numeric": "numeric",
    "decimal": "numeric",
    "money": "numeric",
    "real": "float4",
    "float4": "float4",
    "float": "float4",
    "double precision": "float8",
    "float8": "float8",
    "double": "float8",
    "text": "text",
    "string": "text",
    "character varying": "text",
    "varchar": "text",
    "character": "text",
    "char": "text",
    "bpchar": "text",
    "name": "text",
    "citext": "text",
    "boolean": "bool",
    "bool": "bool",
    "date": "date",
    "timestamp without time zone": "timestamp",
    "timestamp": "timestamp",
    "timestamp_ntz": "timestamp",
    "timestamp with time zone": "timestamptz",
    "timestamptz": "timestamptz",
    "timestamp_ltz": "timestamptz",
    "interval": "interval",
    "uuid": "uuid",
    "bytea": "bytea",
    "binary": "bytea",
    "json": "json",
    "jsonb": "json",
}


def _category_from_name(type_name: str) -> str | None:
    """Map a PostgreSQL or Spark type name (``numeric(10,2)``, ``decimal(38,18)``) to a category."""
    name = type_name.strip().lower().strip('"')
    if name.endswith("[]") or name.startswith(("array<", "array(", "_")):
        return "array"
    name = re.sub(r"\(\s*\d+(?:\s*,\s*-?\d+)?\s*\)", "", name)
    name = re.sub(r"\s+", " ", name).strip()
    return _TYPE_NAME_CATEGORIES.get(name)


def _common_type(types: Iterable[str | None]) -> str | None:
    """PostgreSQL's resolved type of CASE/COALESCE/UNION branches (None when unknown)."""
    known: list[str] = []
    for pg_type in types:
        if pg_type is None:
            return None
        if pg_type != "null":
            known.append(pg_type)
    if not known:
        return None
    if all(t in _INT_TYPES for t in known):
        return max(known, key=_INT_TYPES.index)
    if all(t in _NUMBER_TYPES for t in known):
        if any(t in _FLOAT_TYPES for t in known):
            return "float8"
        return "numeric"
    if all(t == known[0] for t in known):
        return known[0]
    if set(known) <= {"timestamp", "timestamptz", "date"}:
        return "timestamptz" if "timestamptz" in known else "timestamp"
    return None


def _arithmetic_type(node: exp.Expr, left: str | None, right: str | None) -> str | None:
    """Result category of ``+ - * / %`` in PostgreSQL."""
    if "null" in (left, right):
        return None
    if isinstance(node, (exp.Add, exp.Sub, exp.Mod)) and (left in _FLOAT_TYPES or right in _FLOAT_TYPES):
        # No PostgreSQL +, - or % operator mixes double precision with a non-number.
        return "float8"
    if left is None or right is None:
        return None
    if left in _NUMBER_TYPES and right in _NUMBER_TYPES:
        return _common_type((left, right))
    pair = (left, right)
    if isinstance(node, exp.Add):
        if pair in (("date", "int4"), ("int4", "date"), ("date", "int2"), ("int2", "date")):
            return "date"
        if "interval" in pair:
            other = right if left == "interval" else left
            if other in ("timestamp", "timestamptz", "interval"):
                return other
            if other == "date":
                return "timestamp"
    if isinstance(node, exp.Sub):
        if pair == ("date", "date"):
            return "int4"
        if left == "date" and right in ("int4", "int2"):
            return "date"
        if right == "interval" and left in ("timestamp", "timestamptz", "interval"):
            return left
        if right == "interval" and left == "date":
            return "timestamp"
        if left in ("timestamp", "timestamptz") and right == left:
            return "interval"
    if isinstance(node, (exp.Mul, exp.Div)) and "interval" in pair:
        return "interval"
    return None


_FIXED_RESULT_TYPES: dict[type[exp.Expr], str] = {
    exp.Count: "int8",
    exp.RowNumber: "int8",
    exp.Rank: "int8",
    exp.DenseRank: "int8",
    exp.Ntile: "int4",
    exp.PercentRank: "float8",
    exp.CumeDist: "float8",
    exp.Length: "int4",
    exp.BitLength: "int4",
    exp.StrPosition: "int4",
    exp.Ascii: "int4",
    exp.Lower: "text",
    exp.Upper: "text",
    exp.Substring: "text",
    exp.Trim: "text",
    exp.Left: "text",
    exp.Right: "text",
    exp.Replace: "text",
    exp.Concat: "text",
    exp.ConcatWs: "text",
    exp.Pad: "text",
    exp.Repeat: "text",
    exp.Reverse: "text",
    exp.SplitPart: "text",
    exp.Translate: "text",
    exp.MD5: "text",
    exp.Chr: "text",
    exp.RegexpReplace: "text",
    exp.GroupConcat: "text",
    exp.DPipe: "text",
    exp.TimeToStr: "text",
    exp.LogicalAnd: "bool",
    exp.LogicalOr: "bool",
    exp.Extract: "numeric",
    exp.CurrentTimestamp: "timestamptz",
    exp.CurrentDate: "date",
    exp.Localtimestamp: "timestamp",
    exp.StrToDate: "date",
    exp.StrToTime: "timestamptz",
    exp.UnixToTime: "timestamptz",
    exp.TimestampFromParts: "timestamp",
    exp.Rand: "float8",
    exp.Pi: "float8",
    exp.Interval: "interval",
    exp.Uuid: "uuid",
    exp.Boolean: "bool",
    exp.Not: "bool",
    exp.Predicate: "bool",
    exp.Connector: "bool",
    exp.Exists: "bool",
}
_SAME_AS_ARGUMENT: tuple[type[exp.Expr], ...] = (
    exp.Paren,
    exp.Alias,
    exp.Neg,
    exp.Abs,
    exp.Ceil,
    exp.Floor,
    exp.Round,
    exp.Trunc,
    exp.Sign,
    exp.Min,
    exp.Max,
    exp.Lag,
    exp.Lead,
    exp.FirstValue,
    exp.LastValue,
    exp.NthValue,
    exp.Nullif,
    exp.Window,
    exp.Filter,
    exp.AnyValue,
    exp.Sqrt,
    exp.Cbrt,
    exp.Exp,
    exp.Ln,
    exp.Collate,
)


class _TypeInference:
    """Infer PostgreSQL type categories of a query's expressions.

    The category of every node is stored in ``node.meta["pgt_type"]``
    (``None`` when unknown) for the rewriter to read.
    """

    def __init__(self, query: exp.Expr, column_types: Mapping[tuple[str, str], Mapping[str, str]]) -> None:
        self._query = query
        self._columns: dict[tuple[str, str], dict[str, str | None]] = {
            (schema, table): {name: _category_from_name(type_name) for name, type_name in columns.items()}
            for (schema, table), columns in column_types.items()
        }
        self._widths: dict[tuple[str, str], dict[str, int | None]] = {
            key: {name: blank_padded.width_from_type_name(type_name) for name, type_name in columns.items()}
            for key, columns in column_types.items()
        }
        self._ctes = _cte_names(query)
        self._scope_of: dict[int, Scope] = {}
        try:
            scopes = traverse_scope(query)
        except (SqlglotError, KeyError, AttributeError, ValueError):
            scopes = []
        for scope in scopes:
            for column in scope.columns:
                self._scope_of.setdefault(id(column), scope)
        self._memo: dict[int, str | None] = {}
        self._busy: set[int] = set()

    def annotate(self) -> None:
        """Store the inferred category on every node of the query."""
        for node in list(self._query.walk()):
            node.meta[_META_KEY] = self.type_of(node)
            width = self.padded_width(node)
            if width is not None:
                node.meta[blank_padded.WIDTH_KEY] = width

    def padded_width(self, node: exp.Expr | None, depth: int = 0) -> int | None:
        """``n`` when ``node`` is a ``character(n)`` value, ``0`` for ``bpchar`` without a length, else None."""
        while isinstance(node, exp.Paren):
            node = node.this
        if node is None or depth > 32:
            return None
        if isinstance(node, exp.Cast):
            return blank_padded.width_from_datatype(node.to)
        if isinstance(node, (exp.Coalesce, exp.Min, exp.Max)):
            widths = {
                self.padded_width(arg, depth + 1)
                for arg in [node.this, *node.expressions]
                if not isinstance(arg, exp.Null)
            }
            return widths.pop() if len(widths) == 1 else (0 if None not in widths and widths else None)
        if not isinstance(node, exp.Column):
            return None
        found = self._column_source(node)
        if found is None:
            return None
        source, name = found
        if isinstance(source, Scope):
            names = _scope_output_names(source)
            if names is None or name not in names:
                return None
            return self._query_width(source.expression, names.index(name), depth + 1)
        return self._widths.get(self._table_key(source), {}).get(name)

    def _query_width(self, node: exp.Expr, index: int, depth: int) -> int | None:
        while isinstance(node, exp.Subquery):
            node = node.this
        if isinstance(node, exp.Select):
            projections = node.expressions
            if index < len(projections) and not isinstance(projections[index], exp.Star):
                projection = projections[index]
                return self.padded_width(
                    projection.this if isinstance(projection, exp.Alias) else projection, depth
                )
            return None
        if isinstance(node, exp.SetOperation):
            widths = {
                self._query_width(node.this, index, depth + 1),
                self._query_width(node.expression, index, depth + 1),
            }
            return widths.pop() if len(widths) == 1 else (0 if None not in widths else None)
        return None

    def type_of(self, node: exp.Expr | None) -> str | None:
        """Return the inferred category of ``node`` (memoised)."""
        if node is None:
            return None
        key = id(node)
        if key in self._memo:
            return self._memo[key]
        if key in self._busy:
            return None
        self._busy.add(key)
        try:
            result = self._compute(node)
        finally:
            self._busy.discard(key)
        self._memo[key] = result
        return result

    def _compute(self, node: exp.Expr) -> str | None:
        """Compute a node's category."""
        if isinstance(node, exp.Literal):
            return "text" if node.is_string else _number_literal_type(node.this)
        if isinstance(node, exp.Null):
            return "null"
        if isinstance(node, exp.Cast):
            return _category_from_datatype(node.to)
        if isinstance(node, exp.Column):
            return self._column_type(node)
        if isinstance(node, _SAME_AS_ARGUMENT):
            return self.type_of(_first_argument(node))
        if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod)):
            return _arithmetic_type(node, self.type_of(node.this), self.type_of(node.expression))
        if isinstance(node, exp.IntDiv):
            return "int8"
        for cls, category in _FIXED_RESULT_TYPES.items():
            if isinstance(node, cls):
                return category
        if isinstance(node, exp.Case):
            branches = [branch.args.get("true") for branch in node.args.get("ifs") or []]
            default = node.args.get("default")
            return _common_type(self.type_of(b) for b in [*branches, default] if b is not None)
        if isinstance(node, exp.If):
            return _common_type(
                self.type_of(b) for b in (node.args.get("true"), node.args.get("false")) if b is not None
            )
        if isinstance(node, (exp.Coalesce, exp.Greatest, exp.Least)):
            return _common_type(self.type_of(arg) for arg in [node.this, *node.expressions])
        if isinstance(node, exp.Sum):
            inner = self.type_of(_first_argument(node))
            return {"int2": "int8", "int4": "int8", "int8": "numeric"}.get(inner or "", inner)
        if isinstance(node, exp.Avg):
            inner = self.type_of(_first_argument(node))
            if inner in (*_INT_TYPES, "numeric"):
                return "numeric"
            return "float8" if inner in _FLOAT_TYPES else inner
        if isinstance(node, (exp.Stddev, exp.StddevSamp, exp.StddevPop, exp.Variance, exp.VariancePop)):
            return "numeric" if self.type_of(_first_argument(node)) in (*_INT_TYPES, "numeric") else "float8"
        if isinstance(node, (exp.Log, exp.Pow)):
            return self.type_of(node.expression if node.expression is not None else node.this)
        if isinstance(node, (exp.TimestampTrunc, exp.DateTrunc)):
            inner = self.type_of(node.this)
            return "timestamptz" if inner == "date" else inner
        if isinstance(node, exp.WithinGroup):
            if isinstance(node.this, exp.PercentileCont):
                return "float8"
            ordered = node.find(exp.Ordered)
            return self.type_of(ordered.this) if ordered is not None else None
        if isinstance(node, (exp.Subquery, exp.Select, exp.SetOperation)):
            return self._query_type(node, 0)
        if isinstance(node, exp.Anonymous):
            name = node.name.lower()
            if name == "make_date":
                return "date"
            if name in _TIMESTAMP_FUNCTIONS:
                return "timestamptz"
            if name == "every":
                return "bool"
            if name == "octet_length":
                return "int4"
        return None

    def _query_type(self, node: exp.Expr, index: int) -> str | None:
        """Category of the ``index``-th output column of a (sub)query."""
        while isinstance(node, exp.Subquery):
            node = node.this
        if isinstance(node, exp.Select):
            projections = node.expressions
            if index < len(projections) and not isinstance(projections[index], exp.Star):
                return self.type_of(projections[index])
            return None
        if isinstance(node, exp.SetOperation):
            return _common_type(
                (self._query_type(node.this, index), self._query_type(node.expression, index))
            )
        if isinstance(node, exp.Values):
            rows = node.expressions
            return _common_type(
                self.type_of(row.expressions[index])
                if isinstance(row, exp.Tuple) and index < len(row.expressions)
                else None
                for row in rows
            )
        return None

    def _column_type(self, column: exp.Column) -> str | None:
        """Resolve a column reference to its source and return that column's category."""
        found = self._column_source(column)
        return None if found is None else self._source_column_type(*found)

    def _column_source(self, column: exp.Column) -> tuple[exp.Table | Scope, str] | None:
        """The FROM source (a table, or a derived table's scope) a column reference reads, and its name."""
        scope = self._scope_of.get(id(column))
        name = column.name
        table = column.table
        while scope is not None:
            if table:
                source = scope.sources.get(table)
                if source is not None:
                    return source, name
            else:
                sources = [source for _node, source in scope.selected_sources.values()]
                knowledge = [self._source_has_column(source, name) for source in sources]
                matches = [source for source, has in zip(sources, knowledge, strict=True) if has]
                if len(matches) == 1:
                    return matches[0], name
                if matches or any(has is None for has in knowledge):
                    return None
            scope = scope.parent
        return None

    def _table_key(self, table: exp.Table) -> tuple[str, str]:
        """The ``(schema, table)`` key of a base-table reference."""
        return (table.text("db") or "pg_catalog", table.name)

    def _source_has_column(self, source: exp.Table | Scope, name: str) -> bool | None:
        """Whether a FROM source has a column (None when that is not known)."""
        if isinstance(source, Scope):
            names = _scope_output_names(source)
            return None if names is None else name in names
        columns = self._columns.get(self._table_key(source))
        return None if columns is None else name in columns

    def _source_column_type(self, source: exp.Table | Scope, name: str) -> str | None:
        """Category of a column of a FROM source."""
        if isinstance(source, Scope):
            names = _scope_output_names(source)
            if names is None or name not in names:
                return None
            return self._query_type(source.expression, names.index(name))
        columns = self._columns.get(self._table_key(source))
        return None if columns is None else columns.get(name)


def _scope_output_names(scope: Scope) -> list[str] | None:
    """Output column names of a derived table, CTE or VALUES list."""
    node = scope.expression
    alias: exp.Expr | None = None
    if isinstance(node, exp.Values):
        alias = node.args.get("alias")
    elif isinstance(node.parent, (exp.Subquery, exp.CTE)):
        alias = node.parent.args.get("alias")
    if isinstance(alias, exp.TableAlias) and alias.columns:
        return [column.name for column in alias.columns]
    while isinstance(node, exp.SetOperation):
        node = node.this
    while isinstance(node, exp.Subquery):
        node = node.this
    if isinstance(node, exp.Select):
        return list(node.named_selects)
    return None


def _first_argument(node: exp.Expr) -> exp.Expr | None:
    """The main argument of a function-like node (unwrapping DISTINCT)."""
    argument = node.this
    if isinstance(argument, exp.Distinct) and argument.expressions:
        return argument.expressions[0]
    return argument if isinstance(argument, exp.Expr) else None


def _number_literal_type(text: str) -> str | None:
    """PostgreSQL's type of an unquoted numeric constant."""
    if re.fullmatch(r"\d+", text):
        value = int(text)
        if value <= 2**31 - 1:
            return "int4"
        if value <= 2**63 - 1:
            return "int8"
        return "numeric"
    return "numeric"


# --------------------------------------------------------------------------- rewriting


def _rewrite_quantified(query: exp.Query) -> exp.Query:
    """Rewrite ``x op ANY/ALL (ARRAY[...] | subquery)`` into forms Spark runs."""
    for node in list(query.find_all(exp.Any, exp.All, exp.Anonymous)):
        if isinstance(node, exp.Anonymous):
            if node.name.upper() not in ("ANY", "ALL") or len(node.expressions) != 1:
                continue
            quantifier, operand = node.name.upper(), node.expressions[0]
        else:
            quantifier, operand = ("ANY" if isinstance(node, exp.Any) else "ALL"), node.this
        comparison = node.parent
        if not isinstance(comparison, _QUANTIFIED_PARENTS):
            continue
        left = comparison.this
        elements = _array_elements(operand)
        replacement: exp.Expr
        if elements is not None:
            if quantifier == "ANY" and isinstance(comparison, exp.EQ):
                replacement = exp.In(this=left, expressions=elements)
            elif quantifier == "ALL" and isinstance(comparison, exp.NEQ):
                replacement = exp.Not(this=_paren(exp.In(this=left, expressions=elements)))
            else:
                parts: list[exp.Expr] = [
                    comparison.__class__(this=left.copy(), expression=element) for element in elements
                ]
                replacement = exp.or_(*parts) if quantifier == "ANY" else exp.and_(*parts)
        else:
            subquery = _subquery_operand(operand)
            if subquery is None:
                continue
            membership = exp.In(this=left, query=exp.Subquery(this=subquery))
            replacement = membership if quantifier == "ANY" else exp.Not(this=_paren(membership))
        comparison.replace(_paren(replacement))
    return query


class _Rewriter:
    """Post-order rewrite of a typed PostgreSQL tree into Spark semantics."""

    def __init__(self) -> None:
        self._handlers: dict[type[exp.Expr], Callable[[Any], exp.Expr]] = {
            exp.Div: self._div,
            exp.Cast: self._cast,
            exp.Round: self._round,
            exp.Trunc: self._trunc,
            exp.Log: self._log,
            exp.Extract: self._extract,
            exp.TimestampTrunc: self._date_trunc,
            exp.DateTrunc: self._date_trunc,
            exp.RegexpLike: self._regexp_like,
            exp.RegexpILike: self._regexp_like,
            exp.RegexpReplace: self._regexp_replace,
            exp.Substring: self._substring,
            exp.Left: self._left,
            exp.Right: self._right,
            exp.Concat: self._concat,
            exp.ConcatWs: self._concat_ws,
            exp.WithinGroup: self._within_group,
            exp.UnixToTime: self._unix_to_time,
            exp.Anonymous: self._anonymous,
            exp.Add: self._date_arithmetic,
            exp.Sub: self._date_arithmetic,
            exp.Collate: self._collate,
            exp.Like: self._blank_sensitive,
            exp.ILike: self._blank_sensitive,
        }

    def rewrite(self, node: exp.Expr) -> exp.Expr:
        """Rewrite ``node``'s subtree bottom-up and return its replacement."""
        for child in list(node.iter_expressions()):
            self.rewrite(child)
        handler = self._handlers.get(type(node))
        if handler is None:
            return node
        parent, arg_key, index = node.parent, node.arg_key, node.index
        pg_type = _pg_type(node)
        replacement = handler(node)
        if replacement is node:
            return node
        if _META_KEY not in replacement.meta:
            replacement.meta[_META_KEY] = pg_type
        if blank_padded.WIDTH_KEY in node.meta and blank_padded.WIDTH_KEY not in replacement.meta:
            replacement.meta[blank_padded.WIDTH_KEY] = node.meta[blank_padded.WIDTH_KEY]
        if parent is not None and arg_key is not None:
            parent.set(arg_key, replacement, index)
        return replacement

    # -- arithmetic

    def _div(self, node: exp.Div) -> exp.Expr:
        """PostgreSQL division: integer operands truncate."""
        left, right = node.this, node.expression
        left_type, right_type = _pg_type(left), _pg_type(right)
        if left_type in _INT_TYPES and right_type in _INT_TYPES:
            quotient = exp.IntDiv(this=left, expression=right)
            widest = max((left_type, right_type), key=_INT_TYPES.index)
            if widest == "int8":
                return _typed(quotient, "int8")
            return _typed(_cast(quotient, "INT" if widest == "int4" else "SMALLINT"), widest)
        fractional = exp.Div(this=left, expression=right, typed=False, safe=False)
        if any(t is not None and t not in _INT_TYPES for t in (left_type, right_type)):
            # A known non-integer operand (numeric, float, NULL...) makes it a true division.
            return fractional
        condition = _and_conditions(_integer_condition(left), _integer_condition(right))
        if condition is False:
            return fractional
        assert not isinstance(condition, bool), "both operands known to be integers is handled above"
        integral = exp.IntDiv(this=_cast(left.copy(), "BIGINT"), expression=_cast(right.copy(), "BIGINT"))
        dispatch = exp.Case(ifs=[exp.If(this=condition, true=integral)], default=fractional)
        dispatch.meta[_INT_CONDITION_KEY] = condition.copy()
        return dispatch

    def _date_arithmetic(self, node: exp.Add | exp.Sub) -> exp.Expr:
        """``date - date`` is a day count; dates combined with intervals become timestamps."""
        left, right = node.this, node.expression
        left_type, right_type = _pg_type(left), _pg_type(right)
        date_or_unknown = {left_type, right_type} <= {"date", None}
        if isinstance(node, exp.Sub) and "date" in (left_type, right_type) and date_or_unknown:
            # date - date counts days (Spark would return an interval).  With one side of
            # unknown type the other is assumed to be a date as well: PostgreSQL's only
            # other choice, date - integer, is refused by Spark's DATEDIFF rather than
            # silently computed differently.
            return _typed(_func("DATEDIFF", left, right), "int4")
        # date +/- interval is a timestamp in PostgreSQL (Spark keeps a date, or fails when the
        # interval has a time part).  An operand of unknown type next to an interval is a date
        # or a timestamp, and casting a timestamp to TIMESTAMP changes nothing.
        if right_type == "interval" and left_type in ("date", None):
            node.set("this", _cast(left, "TIMESTAMP"))
        elif isinstance(node, exp.Add) and left_type == "interval" and right_type in ("date", None):
            node.set("expression", _cast(right, "TIMESTAMP"))
        return node

    # -- casts

    def _cast(self, node: exp.Cast) -> exp.Expr:
        """Casts with PostgreSQL's conversion rules."""
        value = node.this
        value_type = _pg_type(value)
        to = node.to
        kind = to.this
        if kind == exp.DType.ARRAY:
            return node
        if kind in _BLANK_PADDED:
            return blank_padded.cast_to_blank_padded(value, blank_padded.width_from_datatype(to) or 0)
        if kind in (exp.DType.TEXT, exp.DType.VARCHAR, exp.DType.NVARCHAR, exp.DType.NAME, exp.DType.UUID):
            text = value if _is_string_literal(value) else _cast(value, "STRING")
            params = _type_params(to)
            if kind in (exp.DType.VARCHAR, exp.DType.NVARCHAR) and params:
                return exp.Left(this=text, expression=exp.Literal.number(params[0]))
            return text
        if kind in (exp.DType.SMALLINT, exp.DType.INT, exp.DType.BIGINT):
            target = {exp.DType.SMALLINT: "SMALLINT", exp.DType.INT: "INT"}.get(kind, "BIGINT")
            return self._integer_cast(value, value_type, target)
        if kind == exp.DType.DECIMAL:
            return self._decimal_cast(value, value_type, _type_params(to))
        if kind in (exp.DType.TIMESTAMP, exp.DType.TIMESTAMPTZ):
            return _cast(value, "TIMESTAMP")
        if kind == exp.DType.INTERVAL:
            parts = _parse_interval(value.this) if _is_string_literal(value) else None
            if parts is None:
                raise UnsupportedQueryError(
                    "intervals are only supported as constants such as '1 day'::interval"
                )
            years, months, weeks, days, hours, minutes, seconds = parts
            numbers = [exp.Literal.number(v) for v in (years, months, weeks, days, hours, minutes)]
            return _func("MAKE_INTERVAL", *numbers, exp.Literal.number(str(seconds)))
        if kind in (exp.DType.DOUBLE, exp.DType.FLOAT, exp.DType.BOOLEAN, exp.DType.DATE):
            return exp.Cast(this=value, to=exp.DataType(this=kind))
        raise UnsupportedQueryError(f"casts to {to.sql(dialect=_READ).lower()} are not supported on Spark")

    def _integer_cast(self, value: exp.Expr, value_type: str | None, target: str) -> exp.Expr:
        """PostgreSQL rounds (never truncates) when converting to an integer type."""
        if isinstance(value, exp.Null) or value_type in (*_INT_TYPES, "text", "bool"):
            return _cast(value, target)
        if value_type == "numeric":
            return _cast(exp.Round(this=value, decimals=exp.Literal.number(0)), target)
        if value_type in _FLOAT_TYPES:
            return _cast(_func("BROUND", value, exp.Literal.number(0)), target)
        as_float = _cast(_func("BROUND", _cast(value.copy(), "DOUBLE"), exp.Literal.number(0)), target)
        as_decimal = _cast(exp.Cast(this=value, to=_decimal_type(38, 0)), target)
        return exp.Case(
            ifs=[exp.If(this=_typeof_in(value.copy(), _SPARK_FLOAT_TYPENAMES), true=as_float)],
            default=as_decimal,
        )

    def _decimal_cast(self, value: exp.Expr, value_type: str | None, params: list[int]) -> exp.Expr:
        """``::numeric`` and ``::numeric(p, s)``; see the module docs for the choice of types."""
        if params:
            target = _decimal_type(params[0], params[1] if len(params) > 1 else 0)
        else:
            constant = _literal_decimal(value)
            if constant is not None:
                precision, scale = _decimal_shape(constant)
                return exp.Cast(
                    this=exp.Literal.string(_plain_decimal(constant)), to=_decimal_type(precision, scale)
                )
            if value_type in _INT_TYPES:
                return exp.Cast(this=value, to=_decimal_type(_DECIMAL_FOR_INT[value_type], 0))
            if value_type == "numeric":
                return value
            target = _decimal_type(38, 18)
        if value_type in _FLOAT_TYPES:
            return exp.Cast(this=_float_as_pg_text(value), to=target)
        if value_type is not None or isinstance(value, (exp.Literal, exp.Null)):
            return exp.Cast(this=value, to=target)
        # Unknown type: a double must go through PostgreSQL's 15-digit conversion.
        # Both branches have the same Spark type, so the test costs no precision.
        as_float = exp.Cast(this=_float_as_pg_text(value.copy()), to=target.copy())
        return exp.Case(
            ifs=[exp.If(this=_typeof_in(value.copy(), _SPARK_FLOAT_TYPENAMES), true=as_float)],
            default=exp.Cast(this=value, to=target),
        )

    # -- numeric functions

    def _round(self, node: exp.Round) -> exp.Expr:
        """``round(double precision)`` rounds half to even in PostgreSQL."""
        if node.args.get("decimals") is not None:
            return node
        value = node.this
        value_type = _pg_type(value)
        if value_type in _FLOAT_TYPES:
            return _func("BROUND", value, exp.Literal.number(0))
        if value_type in (*_INT_TYPES, "numeric"):
            return node
        return exp.Case(
            ifs=[
                exp.If(
                    this=_typeof_in(value.copy(), _SPARK_FLOAT_TYPENAMES),
                    true=_func("BROUND", value.copy(), exp.Literal.number(0)),
                )
            ],
            default=exp.Round(this=value, decimals=exp.Literal.number(0)),
        )

    def _trunc(self, node: exp.Trunc) -> exp.Expr:
        """``trunc`` rounds toward zero."""
        value = node.this
        decimals = node.args.get("decimals")
        if decimals is None and _pg_type(value) in _FLOAT_TYPES:
            down, up = _func("FLOOR", value.copy()), _func("CEIL", value.copy())
        else:
            places = decimals if decimals is not None else exp.Literal.number(0)
            down, up = _func("FLOOR", value.copy(), places.copy()), _func("CEIL", value.copy(), places.copy())
        negative = exp.LT(this=value, expression=exp.Literal.number(0))
        return exp.Case(ifs=[exp.If(this=negative, true=up)], default=down)

    def _log(self, node: exp.Log) -> exp.Expr:
        """``log(x)`` is the base-10 logarithm in PostgreSQL."""
        if node.args.get("expression") is None:
            return _func("LOG10", node.this)
        return node

    # -- date and time

    def _extract(self, node: exp.Extract) -> exp.Expr:
        """``extract``/``date_part`` fields with PostgreSQL's numbering."""
        field = _extract_field(node)
        value = node.expression
        if field in _EXTRACT_FIELDS:
            return exp.Extract(this=exp.var(_EXTRACT_FIELDS[field]), expression=value)
        if field == "dow":
            sunday_is_one = exp.Extract(this=exp.var("DOW"), expression=value)
            return _paren(exp.Sub(this=sunday_is_one, expression=exp.Literal.number(1)))
        if field == "epoch":
            micros = _func("UNIX_MICROS", _cast(value, "TIMESTAMP"))
            return _paren(
                exp.Div(
                    this=exp.Cast(this=micros, to=_decimal_type(20, 0)),
                    expression=exp.Literal.number(1000000),
                    typed=False,
                    safe=False,
                )
            )
        factor = 1000 if field.startswith("milli") else 1000000
        seconds = exp.Extract(this=exp.var("SECOND"), expression=value)
        return _paren(exp.Mul(this=seconds, expression=exp.Literal.number(factor)))

    def _date_trunc(self, node: exp.Expr) -> exp.Expr:
        """``date_trunc(unit, x)`` with Spark's unit names."""
        unit = _TRUNC_UNITS[_unit_name(node.args.get("unit"))]
        return _func("DATE_TRUNC", exp.Literal.string(unit), node.this)

    def _unix_to_time(self, node: exp.UnixToTime) -> exp.Expr:
        """``to_timestamp(seconds)`` keeps fractional seconds."""
        return _func("TIMESTAMP_SECONDS", node.this)

    # -- text

    def _regexp_like(self, node: exp.Expr) -> exp.Expr:
        """``~`` and ``~*``: ``.`` matches newlines in PostgreSQL regular expressions."""
        flags = "i" if isinstance(node, exp.RegexpILike) else ""
        return exp.RegexpLike(
            this=blank_padded.padded(node.this, "a regular expression match"),
            expression=_java_pattern(node.expression, flags),
        )

    def _blank_sensitive(self, node: exp.Like | exp.ILike) -> exp.Expr:
        """LIKE / ILIKE see a ``character(n)`` value's padding blanks in PostgreSQL."""
        node.set("this", blank_padded.padded(node.this, "LIKE"))
        return node

    def _regexp_replace(self, node: exp.RegexpReplace) -> exp.Expr:
        """``regexp_replace``: first match only unless the ``g`` flag is given."""
        flags = _regexp_flags(node) or ""
        case_flag = "i" if "i" in flags else ""
        replacement = node.args["replacement"].this
        pattern = node.expression
        if "g" in flags:
            java_replacement = _java_replacement(replacement, 0, "$0")
            assert java_replacement is not None
            return _func(
                "REGEXP_REPLACE",
                node.this,
                _java_pattern(pattern, case_flag),
                exp.Literal.string(java_replacement),
            )
        # Group 1 is the text before the first match, group 2 the match itself
        # (numbered, not named: Spark would substitute "${name}" as a variable).
        java_replacement = _java_replacement(replacement, 2, "$2")
        assert java_replacement is not None
        first_only = f"(?{case_flag}s)^(.*?)({pattern.this})"
        return _func(
            "REGEXP_REPLACE",
            node.this,
            exp.Literal.string(first_only),
            exp.Literal.string("$1" + java_replacement),
        )

    def _substring(self, node: exp.Substring) -> exp.Expr:
        """``substring`` positions before 1 count as characters that do not exist."""
        start = node.args.get("start")
        length = node.args.get("length")
        if start is None or _positive_int_literal(start):
            return node
        clamped = _func("GREATEST", start.copy(), exp.Literal.number(1))
        if length is None:
            return exp.Substring(this=node.this, start=clamped)
        remaining = exp.Sub(
            this=exp.Add(this=_paren(start), expression=_paren(length)), expression=clamped.copy()
        )
        new_length = _func("GREATEST", remaining, exp.Literal.number(0))
        return exp.Substring(this=node.this, start=clamped, length=new_length)

    def _left(self, node: exp.Left) -> exp.Expr:
        """``left(s, -n)`` drops the last n characters."""
        text, count = node.this, node.expression
        if _non_negative_int_literal(count):
            return node
        all_but = exp.Substring(
            this=text.copy(),
            start=exp.Literal.number(1),
            length=_func(
                "GREATEST",
                exp.Add(this=exp.Length(this=text.copy()), expression=_paren(count.copy())),
                exp.Literal.number(0),
            ),
        )
        return exp.If(
            this=exp.LT(this=count.copy(), expression=exp.Literal.number(0)), true=all_but, false=node
        )

    def _right(self, node: exp.Right) -> exp.Expr:
        """``right(s, -n)`` drops the first n characters."""
        text, count = node.this, node.expression
        if _non_negative_int_literal(count):
            return node
        all_but = exp.Substring(
            this=text.copy(), start=exp.Sub(this=exp.Literal.number(1), expression=_paren(count.copy()))
        )
        return exp.If(
            this=exp.LT(this=count.copy(), expression=exp.Literal.number(0)), true=all_but, false=node
        )

    def _concat(self, node: exp.Concat) -> exp.Expr:
        """``concat`` ignores NULL arguments in PostgreSQL."""
        return _func(
            "CONCAT_WS",
            exp.Literal.string(""),
            *(_as_pg_text(blank_padded.padded(arg, "concat()")) for arg in node.expressions),
        )

    def _concat_ws(self, node: exp.ConcatWs) -> exp.Expr:
        """``concat_ws`` with every argument converted to text."""
        separator, *values = node.expressions
        return _func(
            "CONCAT_WS", separator, *(_as_pg_text(blank_padded.padded(arg, "concat_ws()")) for arg in values)
        )

    def _collate(self, node: exp.Collate) -> exp.Expr:
        """``COLLATE "C"`` is Spark's default code-point ordering."""
        return node.this

    # -- aggregates and others

    def _within_group(self, node: exp.WithinGroup) -> exp.Expr:
        """Exact percentiles (sqlglot would make them approximate)."""
        function = node.this
        if isinstance(function, (exp.PercentileCont, exp.PercentileDisc)):
            name = "PERCENTILE_CONT" if isinstance(function, exp.PercentileCont) else "PERCENTILE_DISC"
            return exp.WithinGroup(this=_func(name, function.this), expression=node.expression)
        return node

    def _anonymous(self, node: exp.Anonymous) -> exp.Expr:
        """Functions sqlglot does not model that have a direct Spark replacement."""
        name = node.name.lower()
        if name == "octet_length":
            node.set("expressions", [blank_padded.padded(arg, "octet_length()") for arg in node.expressions])
            return node
        if name in _TIMESTAMP_FUNCTIONS:
            return exp.CurrentTimestamp()
        if name in _UUID_FUNCTIONS:
            return _func("UUID")
        return node


def _integer_condition(node: exp.Expr) -> exp.Expr | bool:
    """Whether ``node`` has a PostgreSQL integer type: True/False, or a run-time Spark test.

    The run-time test is ``typeof(...)`` of the leaves whose type is unknown.
    Arithmetic is looked through, so a division nested in another one is
    judged by its operands rather than by the Spark type of the inner
    division (which is ``DOUBLE`` when it was decided at run time).
    """
    pg_type = _pg_type(node)
    if pg_type is not None:
        return pg_type in _INT_TYPES
    recorded = node.meta.get(_INT_CONDITION_KEY)
    if isinstance(recorded, exp.Expr):
        return recorded.copy()
    if isinstance(node, (exp.Paren, exp.Neg)):
        return _integer_condition(node.this)
    if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Mod)):
        return _and_conditions(_integer_condition(node.this), _integer_condition(node.expression))
    return _typeof_in(node.copy(), _SPARK_INT_TYPENAMES)


def _and_conditions(left: exp.Expr | bool, right: exp.Expr | bool) -> exp.Expr | bool:
    """Three-way AND of conditions that may be known constants."""
    if left is False or right is False:
        return False
    if left is True:
        return right
    if right is True:
        return left
    return exp.and_(left, right)


def _float_as_pg_text(value: exp.Expr) -> exp.Expr:
    """A double as PostgreSQL converts it to numeric: 15 significant digits (NULL stays NULL)."""
    return exp.Nullif(
        this=_func("FORMAT_STRING", exp.Literal.string("%.15g"), value), expression=exp.Literal.string("null")
    )


def _plain_decimal(value: Decimal) -> str:
    """A decimal in plain (non-scientific) notation."""
    return format(value, "f")


def _as_pg_text(node: exp.Expr) -> exp.Expr:
    """An argument of ``concat`` converted to text as PostgreSQL's output function would.

    Booleans print as ``t``/``f`` (the first letter of Spark's ``true``/``false``).
    """
    pg_type = _pg_type(node)
    if _is_string_literal(node) or pg_type == "text":
        return node
    if pg_type == "bool":
        return exp.Left(this=_cast(node, "STRING"), expression=exp.Literal.number(1))
    if pg_type is not None or isinstance(node, exp.Literal):
        return _cast(node, "STRING")
    as_bool = exp.Left(this=_cast(node.copy(), "STRING"), expression=exp.Literal.number(1))
    is_bool = exp.EQ(this=_func("TYPEOF", node.copy()), expression=exp.Literal.string("boolean"))
    return exp.Case(ifs=[exp.If(this=is_bool, true=as_bool)], default=_cast(node, "STRING"))


def _positive_int_literal(node: exp.Expr) -> bool:
    """Whether a node is an integer constant of at least 1."""
    return (
        isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit() and int(node.this) >= 1
    )


def _non_negative_int_literal(node: exp.Expr) -> bool:
    """Whether a node is an integer constant of at least 0."""
    return isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit()


def _rewrite_distinct_on(query: exp.Query) -> exp.Query:
    """Replace ``SELECT DISTINCT ON (keys)`` by a ``ROW_NUMBER()`` filter.

    The first row of each key group in the query's ``ORDER BY`` order is
    kept; the ``ORDER BY``, ``LIMIT`` and ``OFFSET`` apply after the filter,
    as in PostgreSQL.
    """
    for select in list(query.find_all(exp.Select)):
        distinct = select.args.get("distinct")
        on = distinct.args.get("on") if isinstance(distinct, exp.Distinct) else None
        if on is None:
            continue
        replacement = _distinct_on_select(select, list(on.expressions))
        if select is query:
            query = replacement
        else:
            select.replace(replacement)
    return query


def _distinct_on_select(select: exp.Select, keys: list[exp.Expr]) -> exp.Select:
    """Build the ``ROW_NUMBER()`` form of one ``SELECT DISTINCT ON``."""
    select.set("distinct", None)
    order = select.args.get("order")
    limit, offset = select.args.get("limit"), select.args.get("offset")
    for arg in ("order", "limit", "offset"):
        select.set(arg, None)
    taken = set(select.named_selects)
    outputs: list[exp.Identifier] = []
    projections: list[exp.Expr] = []
    for projection in select.expressions:
        name = projection.alias_or_name
        quoted = (
            projection.args["alias"].quoted
            if isinstance(projection, exp.Alias) and isinstance(projection.args.get("alias"), exp.Identifier)
            else isinstance(projection, exp.Column) and projection.this.quoted
        )
        if not isinstance(projection, exp.Alias):
            projection = exp.alias_(projection, exp.to_identifier(name, quoted=bool(quoted)))
        projections.append(projection)
        outputs.append(exp.to_identifier(name, quoted=bool(quoted)))
    ordered = list(order.expressions) if isinstance(order, exp.Order) else []
    window_order = [o.copy() for o in ordered] or [
        exp.Ordered(this=key.copy(), nulls_first=False) for key in keys
    ]
    row_number = exp.Window(
        this=exp.RowNumber(),
        partition_by=[key.copy() for key in keys],
        order=exp.Order(expressions=window_order),
    )
    rank_name = _fresh_name(taken, "_pgt_row")
    projections.append(exp.alias_(row_number, rank_name))
    outer_order: list[exp.Expr] = []
    for position, item in enumerate(ordered):
        sort_name = _fresh_name(taken, f"_pgt_sort{position}")
        projections.append(exp.alias_(item.this.copy(), sort_name))
        outer_order.append(
            exp.Ordered(
                this=exp.column(sort_name),
                desc=item.args.get("desc"),
                nulls_first=item.args.get("nulls_first"),
            )
        )
    select.set("expressions", projections)
    outer = exp.Select(expressions=[exp.Column(this=identifier) for identifier in outputs])
    derived = exp.Subquery(this=select, alias=exp.TableAlias(this=exp.to_identifier("_pgt_distinct_on")))
    outer.set(_FROM_KEY, exp.From(this=derived))
    outer.set("where", exp.Where(this=exp.EQ(this=exp.column(rank_name), expression=exp.Literal.number(1))))
    if outer_order:
        outer.set("order", exp.Order(expressions=outer_order))
    if limit is not None:
        outer.set("limit", limit)
    if offset is not None:
        outer.set("offset", offset)
    return outer


def _fresh_name(taken: set[str], base: str) -> str:
    """A column name not yet used in ``taken`` (which is updated)."""
    name, counter = base, 1
    while name in taken:
        name, counter = f"{base}_{counter}", counter + 1
    taken.add(name)
    return name
