"""The function tables of the translation: what Spark runs as is, what it replaces, what is volatile.

Pure.  :func:`volatile_function` and :func:`set_returning_function` answer
for the delta engine too (``dvm/lower_check.py``, ``dvm/lower_from.py``).
"""

from __future__ import annotations

from sqlglot import exp

from pgtrickle.sql.nodes import READ

#: Functions sqlglot does not model but Spark has with the same name and meaning.
SPARK_SAME_FUNCTIONS = frozenset(
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
TIMESTAMP_FUNCTIONS = frozenset({"clock_timestamp", "statement_timestamp", "transaction_timestamp"})


UUID_FUNCTIONS = frozenset({"uuid_generate_v4"})


SEQUENCE_FUNCTIONS = frozenset({"nextval", "currval", "setval", "lastval"})


SET_RETURNING_FUNCTIONS = frozenset(
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


ALLOWED_FUNCS: tuple[type[exp.Expr], ...] = tuple(
    cls for cls in (getattr(exp, name, None) for name in _ALLOWED_FUNC_NAMES) if isinstance(cls, type)
)


IDENTITY_FUNCS: dict[str, str] = {
    "CurrentUser": "current_user returns the Spark user, not the PostgreSQL role",
    "SessionUser": "session_user returns the Spark user, not the PostgreSQL role",
    "CurrentRole": "current_role returns the Spark user, not the PostgreSQL role",
    "CurrentDatabase": "current_database() has no meaning on Spark",
    "CurrentCatalog": "current_catalog has no meaning on Spark",
    "CurrentSchema": "current_schema has no meaning on Spark",
    "CurrentSchemas": "current_schemas() has no meaning on Spark",
    "CurrentVersion": "version() would report Spark's version, not PostgreSQL's",
}


SPECIAL_FUNC_REASONS: dict[str, str] = {
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
EXTRACT_FIELDS = {
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


EXTRACT_REWRITTEN = frozenset({"dow", "epoch", "milliseconds", "millisecond", "microseconds", "microsecond"})


#: ``date_trunc`` units: PostgreSQL name -> Spark unit.
TRUNC_UNITS = {
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


#: PostgreSQL names of the functions sqlglot models as its own classes (set-returning and ``random``).
_PG_FUNCTION_NAMES = {
    "ExplodingGenerateSeries": "generate_series",
    "GenerateSeries": "generate_series",
    "Explode": "unnest",
    "Unnest": "unnest",
    "Posexplode": "unnest",
    "Rand": "random",
}


def volatile_function(tree: exp.Expr) -> str | None:
    """The name of the first volatile function (see :func:`is_volatile`) a parsed query calls, or ``None``."""
    for node in tree.walk():
        if isinstance(node, _VOLATILE_NODES):
            return function_name(node)
        if isinstance(node, exp.Anonymous) and node.name.lower() in _VOLATILE_FUNCTIONS:
            return node.name.lower()
    return None


def set_returning_function(node: exp.Expr) -> str | None:
    """The PostgreSQL name of ``node`` when it is a set-returning function call (``generate_series``...)."""
    if isinstance(node, exp.Func):
        name = function_name(node)
        if name.lower() in SET_RETURNING_FUNCTIONS:
            return name.lower()
    return None


def function_name(node: exp.Expr) -> str:
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
    return node.sql(dialect=READ)
