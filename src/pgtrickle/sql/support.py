"""Why a query (or one expression) cannot run on Spark: :func:`unsupported_reason`.

Pure.  Each check returns the reason as a sentence naming the construct, or
``None``; the first reason found in a walk of the tree wins.
"""

from __future__ import annotations

import re

from sqlglot import exp

from pgtrickle.errors import UnsupportedQueryError
from pgtrickle.sql.functions import (
    ALLOWED_FUNCS,
    EXTRACT_FIELDS,
    EXTRACT_REWRITTEN,
    IDENTITY_FUNCS,
    SEQUENCE_FUNCTIONS,
    SET_RETURNING_FUNCTIONS,
    SPARK_SAME_FUNCTIONS,
    SPECIAL_FUNC_REASONS,
    TIMESTAMP_FUNCTIONS,
    TRUNC_UNITS,
    UUID_FUNCTIONS,
    function_name,
)
from pgtrickle.sql.nodes import (
    BLANK_PADDED_TYPES,
    QUANTIFIED_PARENTS,
    READ,
    array_elements,
    decimal_shape,
    extract_field,
    literal_decimal,
    parse_interval,
    regexp_flags,
    subquery_operand,
    to_java_replacement,
    type_params,
    unit_name,
)
from pgtrickle.sql.parse import parse_query

#: strftime tokens (sqlglot's form of PostgreSQL ``to_char`` patterns) Spark formats identically.
_SAFE_TIME_TOKENS = frozenset({"%Y", "%y", "%m", "%d", "%H", "%M", "%S", "%j", "%f"})


#: Regular-expression syntax PostgreSQL supports but Java does not (or reads differently).
_PG_ONLY_REGEX = re.compile(r"\[\[[:.=]|\\[mMyYZ]|\*\*\*")


_BACKREFERENCE = re.compile(r"\\[1-9]")


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
    return find_unsupported(query)


def is_correlated(subquery: exp.Select) -> bool:
    """Whether ``subquery`` refers to a column of a table outside it (an outer query's)."""
    own = {t.alias_or_name for t in subquery.find_all(exp.Table)}
    return any(c.table and c.table not in own for c in subquery.find_all(exp.Column))


def find_unsupported(query: exp.Expr) -> str | None:
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
            f"the ordered-set aggregate {function_name(node.this)}() WITHIN GROUP is not supported on Spark"
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
        name = function_name(table.this) if isinstance(table.this, exp.Expr) else str(table.this)
        if name.lower() in SET_RETURNING_FUNCTIONS:
            return f"the set-returning function {name}() is not supported"
        return f"functions in FROM ({name}()) are not supported"
    if table.args.get("only"):
        return "FROM ONLY (excluding inheritance children) is not supported"
    if table.args.get("sample"):
        return "TABLESAMPLE is not supported in a stream table query"
    return None


def _quantified_reason(node: exp.Expr, operand: exp.Expr, quantifier: str) -> str | None:
    """Reasons for ``x op ANY/ALL (...)``."""
    parent = node.parent
    if not isinstance(parent, QUANTIFIED_PARENTS) or parent.expression is not node:
        return f"{quantifier} (...) is only supported on the right of a comparison or LIKE"
    if array_elements(operand) is not None:
        return None
    if subquery_operand(operand) is not None:
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
    type_name = to.sql(dialect=READ).lower()
    if kind == exp.DType.ARRAY:
        if _inside_quantified_array(cast) or isinstance(cast.parent, (exp.Any, exp.All)):
            return None
        if isinstance(cast.parent, exp.Anonymous) and cast.parent.name.upper() in ("ANY", "ALL"):
            return None
        return f"casts to the array type {type_name} are not supported"
    if kind in BLANK_PADDED_TYPES:
        return None  # carried without trailing blanks (sql/blank_padded.py)
    if kind in (exp.DType.TEXT, exp.DType.VARCHAR, exp.DType.NVARCHAR, exp.DType.NAME, exp.DType.UUID):
        return None
    if kind in (exp.DType.SMALLINT, exp.DType.INT, exp.DType.BIGINT, exp.DType.DOUBLE, exp.DType.FLOAT):
        return None
    if kind in (exp.DType.BOOLEAN, exp.DType.DATE):
        return None
    if kind == exp.DType.DECIMAL:
        params = type_params(to)
        if params and (params[0] > 38 or (len(params) > 1 and not 0 <= params[1] <= params[0])):
            return f"casts to {type_name} are not supported (Spark decimals have at most 38 digits)"
        if (
            not params
            and (literal := literal_decimal(cast.this)) is not None
            and decimal_shape(literal)[0] > 38
        ):
            return f"the numeric constant {literal} has more than 38 digits, which Spark cannot hold"
        return None
    if kind in (exp.DType.TIMESTAMP, exp.DType.TIMESTAMPTZ):
        params = type_params(to)
        if params and params[0] < 6:
            return f"casts to {type_name} are not supported (Spark does not round timestamps to a precision)"
        return None
    if kind == exp.DType.INTERVAL:
        value = cast.this
        if isinstance(value, exp.Literal) and value.is_string and parse_interval(value.this) is not None:
            return None
        return "intervals are only supported as constants such as '1 day'::interval"
    return f"casts to {type_name} are not supported on Spark"


def _function_reason(node: exp.Func) -> str | None:
    """Reasons tied to a function call."""
    cls_name = type(node).__name__
    if isinstance(node, exp.Anonymous):
        name = node.name.lower()
        if name in ("any", "all"):
            return None
        if name in SEQUENCE_FUNCTIONS:
            return f"the sequence function {name}() changes PostgreSQL state and cannot run on Spark"
        if name in SET_RETURNING_FUNCTIONS:
            return f"the set-returning function {name}() is not supported"
        if name in SPARK_SAME_FUNCTIONS or name in TIMESTAMP_FUNCTIONS or name in UUID_FUNCTIONS:
            return None
        return f"the function {node.name}() has no Spark equivalent"
    if cls_name in IDENTITY_FUNCS:
        return IDENTITY_FUNCS[cls_name]
    if cls_name in SPECIAL_FUNC_REASONS:
        return SPECIAL_FUNC_REASONS[cls_name]
    if cls_name.upper().startswith("JSON") or "JSON" in cls_name.upper():
        return "JSON operators and functions are not supported on Spark"
    if function_name(node).lower() in SET_RETURNING_FUNCTIONS:
        return f"the set-returning function {function_name(node)}() is not supported"
    if not isinstance(node, ALLOWED_FUNCS):
        return f"the function {function_name(node)}() has no Spark equivalent"
    if isinstance(node, exp.Extract):
        field = extract_field(node)
        if field not in EXTRACT_FIELDS and field not in EXTRACT_REWRITTEN:
            return f"extract({field} ...) has no Spark equivalent"
        return None
    if isinstance(node, (exp.TimestampTrunc, exp.DateTrunc)):
        unit = unit_name(node.args.get("unit"))
        if node.args.get("zone") is not None:
            return "date_trunc() with a time zone argument has no Spark equivalent"
        if unit not in TRUNC_UNITS:
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
    flags = regexp_flags(node)
    if flags is None or set(flags) - {"g", "i"}:
        return "regexp_replace() is only supported with the flags 'g' and 'i'"
    pattern_reason = _regex_pattern_reason(node.expression)
    if pattern_reason:
        return pattern_reason
    replacement = node.args.get("replacement")
    if not (isinstance(replacement, exp.Literal) and replacement.is_string):
        return "regexp_replace() needs a constant replacement text to be translated"
    if to_java_replacement(replacement.this, 0, "$0") is None:
        return "regexp_replace() replacement text uses escapes other than \\1-\\9, \\& and \\\\"
    if "g" not in flags:
        pattern = node.expression
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            return "regexp_replace() without the 'g' flag needs a constant pattern to be translated"
        if _BACKREFERENCE.search(pattern.this):
            return "regexp_replace() without the 'g' flag cannot use back-references in the pattern"
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
