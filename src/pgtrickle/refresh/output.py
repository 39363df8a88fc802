"""The rows a refresh computes for PostgreSQL: values named c0.., the weight, the row identity.

The row identity ``__pgt_row_id`` is ``xxhash64`` of the columns at the layout's key positions
(every visible column; a stored aggregate's group keys), computed the same way by FULL and
DIFFERENTIAL refreshes; timestamps are rendered with their offset for COPY. SQL expressions,
not ``pyspark.sql.functions``: the same code serves a local session and a Spark Connect one.
"""

from __future__ import annotations

from collections.abc import Sequence

from pgtrickle.dvm.layout import ROW_ID
from pgtrickle.refresh.read_names import spark_name

__all__ = ["finish_output", "finished_columns", "for_copy", "timestamps"]


def for_copy(column: str, pg_type: str) -> str:
    """A Spark column rendered for COPY into a column of ``pg_type`` (instants keep their offset)."""
    if pg_type == "timestamp with time zone":
        return f"date_format({column}, 'yyyy-MM-dd HH:mm:ss.SSSSSSXXX')"
    return column


def finish_output(df, n_data: int, hash_positions: Sequence[int], dates: bool = True):
    """Name the first ``n_data`` columns c0.., keep the rest, append ``__pgt_row_id``.

    The row identity is ``xxhash64`` of the columns at ``hash_positions`` (every visible column;
    a stored aggregate's group keys), computed the same way for FULL and DIFFERENTIAL refreshes.
    Timestamps are rendered with their offset for COPY.
    """
    # SQL expressions, not pyspark.sql.functions: the same code serves a local session and a
    # Spark Connect one, whichever kind the process's functions module was set up for.
    names = [f"c{i}" for i in range(n_data)] + list(df.columns[n_data:])
    return df.toDF(*names).selectExpr(*finished_columns(names, timestamps(df.schema), hash_positions, dates))


def timestamps(schema) -> list[bool]:
    """Per column of a Spark ``schema``: whether it is a timestamp (rendered for COPY)."""
    from pyspark.sql.types import TimestampType

    return [isinstance(f.dataType, TimestampType) for f in schema.fields]


def finished_columns(
    names: Sequence[str], instants: Sequence[bool], hash_positions: Sequence[int], dates: bool = True
) -> list[str]:
    """The select list of :func:`finish_output` over columns ``names`` (``instants``: which are
    timestamps), ``__pgt_row_id`` last (pure)."""
    if hash_positions:
        row_id = f"xxhash64({', '.join(spark_name(names[i]) for i in hash_positions)})"
    else:
        row_id = "CAST(0 AS BIGINT)"
    cols = []
    for name, instant in zip(names, instants, strict=True):
        if dates and instant:
            cols.append(
                f"date_format({spark_name(name)}, 'yyyy-MM-dd HH:mm:ss.SSSSSSXXX') AS {spark_name(name)}"
            )
        else:
            cols.append(spark_name(name))
    return [*cols, f"{row_id} AS {ROW_ID}"]
