"""PostgreSQL's numeric division as Spark SQL functions, registered on each session that needs them.

The translation (``pgtrickle.sql.numeric_scale``) writes every numeric quotient and ``avg`` as
a call of ``pgt_numeric_div`` (and, for a division of a quotient, ``pgt_numeric_div_scale``):
Python functions (``pgtrickle.sql.numeric_division``) that compute PostgreSQL's exact result
per row. :func:`ensure_functions` registers them on a session before it runs such SQL (a local
JVM session and a Spark Connect one alike). Their module is shipped to the executors by value,
so executors need no pgtrickle installed, only Python and PySpark's worker.

A refused quotient (a row whose exact result does not fit, depends on a display scale Spark does
not carry, or divides by zero) fails the job; :func:`refusal_in` finds it in the error.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from pgtrickle.sql import numeric_division
from pgtrickle.sql.numeric_scale import FUNCTION, SCALE_FUNCTION

_lock = threading.Lock()
_registered: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_registered_ids: dict[int, Any] = {}


def _shipped_by_value() -> None:
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(numeric_division)


def needs_functions(spark_sql: str) -> bool:
    """Whether Spark SQL text calls the numeric division functions."""
    return FUNCTION.upper() in spark_sql.upper()


def ensure_functions(spark: Any, spark_sql: str | None = None) -> None:
    """Register the numeric division functions on ``spark`` (once per session), when
    ``spark_sql`` (if given) calls them."""
    if spark_sql is not None and not needs_functions(spark_sql):
        return
    with _lock:
        try:
            if _registered.get(spark):
                return
        except TypeError:
            if _registered_ids.get(id(spark)) is spark:
                return
        from pyspark.sql.functions import udf
        from pyspark.sql.types import IntegerType, StringType

        _shipped_by_value()
        spark.udf.register(FUNCTION, udf(numeric_division.spark_quotient, StringType(), useArrow=False))
        spark.udf.register(SCALE_FUNCTION, udf(numeric_division.spark_scale, IntegerType(), useArrow=False))
        try:
            _registered[spark] = True
        except TypeError:
            _registered_ids[id(spark)] = spark


def refusal_in(exc: BaseException) -> tuple[str, str] | None:
    """``(sqlstate, message)`` of a refused quotient that failed ``exc`` (a Spark job's error)."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return None
        found = numeric_division.refusal_in_text(str(seen))
        if found is not None:
            return found
        seen = seen.__cause__ or seen.__context__
    return None
