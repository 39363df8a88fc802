"""PostgreSQL type categories: names, casts, constants, and the result types of operators and functions.

Pure rules the type inference (``sql/type_inference.py``) folds over a query.
A category is a short PostgreSQL type name (``"int4"``, ``"numeric"``,
``"text"``, ``"timestamptz"``...), ``"null"`` for a NULL constant, or ``None``
when unknown.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from sqlglot import exp

#: PostgreSQL type categories used by the type inference.
INT_TYPES = ("int2", "int4", "int8")


FLOAT_TYPES = ("float4", "float8")


NUMBER_TYPES = (*INT_TYPES, "numeric", *FLOAT_TYPES)


DECIMAL_FOR_INT = {"int2": 5, "int4": 10, "int8": 20}


SPARK_INT_TYPENAMES = ("tinyint", "smallint", "int", "bigint")


SPARK_FLOAT_TYPENAMES = ("float", "double")


def category_from_datatype(datatype: exp.DataType) -> str | None:
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


def category_from_name(type_name: str) -> str | None:
    """Map a PostgreSQL or Spark type name (``numeric(10,2)``, ``decimal(38,18)``) to a category."""
    name = type_name.strip().lower().strip('"')
    if name.endswith("[]") or name.startswith(("array<", "array(", "_")):
        return "array"
    name = re.sub(r"\(\s*\d+(?:\s*,\s*-?\d+)?\s*\)", "", name)
    name = re.sub(r"\s+", " ", name).strip()
    return _TYPE_NAME_CATEGORIES.get(name)


def common_type(types: Iterable[str | None]) -> str | None:
    """PostgreSQL's resolved type of CASE/COALESCE/UNION branches (None when unknown)."""
    known: list[str] = []
    for pg_type in types:
        if pg_type is None:
            return None
        if pg_type != "null":
            known.append(pg_type)
    if not known:
        return None
    if all(t in INT_TYPES for t in known):
        return max(known, key=INT_TYPES.index)
    if all(t in NUMBER_TYPES for t in known):
        if any(t in FLOAT_TYPES for t in known):
            return "float8"
        return "numeric"
    if all(t == known[0] for t in known):
        return known[0]
    if set(known) <= {"timestamp", "timestamptz", "date"}:
        return "timestamptz" if "timestamptz" in known else "timestamp"
    return None


def arithmetic_type(node: exp.Expr, left: str | None, right: str | None) -> str | None:
    """Result category of ``+ - * / %`` in PostgreSQL."""
    if "null" in (left, right):
        return None
    if isinstance(node, (exp.Add, exp.Sub, exp.Mod)) and (left in FLOAT_TYPES or right in FLOAT_TYPES):
        # No PostgreSQL +, - or % operator mixes double precision with a non-number.
        return "float8"
    if left is None or right is None:
        return None
    if left in NUMBER_TYPES and right in NUMBER_TYPES:
        return common_type((left, right))
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


FIXED_RESULT_TYPES: dict[type[exp.Expr], str] = {
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


SAME_AS_ARGUMENT: tuple[type[exp.Expr], ...] = (
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


def first_argument(node: exp.Expr) -> exp.Expr | None:
    """The main argument of a function-like node (unwrapping DISTINCT)."""
    argument = node.this
    if isinstance(argument, exp.Distinct) and argument.expressions:
        return argument.expressions[0]
    return argument if isinstance(argument, exp.Expr) else None


def number_literal_type(text: str) -> str | None:
    """PostgreSQL's type of an unquoted numeric constant."""
    if re.fullmatch(r"\d+", text):
        value = int(text)
        if value <= 2**31 - 1:
            return "int4"
        if value <= 2**63 - 1:
            return "int8"
        return "numeric"
    return "numeric"
