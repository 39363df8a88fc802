"""Translated queries (pgtrickle.sql.translate) run on a real SparkSession return PostgreSQL's rows.

The string-level checks of the translation are unit tests (tests/unit/test_translate.py); this
module runs translated queries on the test session's SparkSession over small temporary views and
compares the rows with what PostgreSQL returns for the same data (written down by hand).  Query
texts are in the normalised form ``pg_get_viewdef(view, true)`` produces with
``search_path = pg_catalog``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import date
from decimal import Decimal
from typing import Any

import pytest

from pgtrickle.sql.translate import is_volatile
from tests.unit.test_translate import COLUMN_TYPES, spark_sql

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ORDERS_ROWS = [
    (
        1,
        "alice",
        "open",
        Decimal("25.50"),
        3,
        Decimal("1.5"),
        "2024-01-15 10:30:00",
        date(2024, 1, 15),
        True,
        2.5,
        7,
        1,
    ),
    (
        2,
        "bob",
        "closed",
        Decimal("5.00"),
        7,
        Decimal("0.333"),
        "2024-01-16 23:59:59.5",
        date(2024, 1, 16),
        False,
        3.5,
        -7,
        2,
    ),
    (
        3,
        "alice",
        "open",
        Decimal("12.25"),
        -7,
        Decimal("2"),
        "2024-02-01 00:00:00",
        date(2024, 2, 1),
        None,
        -2.5,
        10,
        3,
    ),
    (4, None, "open", None, 2, None, None, None, True, None, None, None),
    (
        5,
        "carol",
        None,
        Decimal("100.00"),
        None,
        Decimal("10.125"),
        "2024-03-10 12:00:00",
        date(2024, 3, 10),
        False,
        0.1,
        3,
        -5,
    ),
    (
        6,
        "bob",
        "closed",
        Decimal("5.00"),
        7,
        Decimal("0.333"),
        "2024-01-16 23:59:59.5",
        date(2024, 1, 16),
        False,
        3.5,
        -7,
        2,
    ),
    (
        7,
        "Dave",
        "open",
        Decimal("-3.75"),
        4,
        Decimal("-1.25"),
        "2023-12-31 23:00:00",
        date(2023, 12, 31),
        True,
        1e20,
        9000000000,
        0,
    ),
]
ORDERS_SCHEMA = (
    "id INT, customer STRING, status STRING, amount DECIMAL(10,2), qty INT, price DECIMAL(38,18), ts STRING,"
    " d DATE, flag BOOLEAN, f DOUBLE, big BIGINT, sm SMALLINT"
)
LINES_ROWS = [(1, "a", 2), (1, "b", 1), (2, "a", 5), (2, "a", 5), (3, None, None), (9, "z", 1), (5, "c", 3)]
MY_TABLE_ROWS = [(1, "x"), (2, None), (2, "y")]


@pytest.fixture(scope="module")
def views(spark: Any) -> Iterator[Any]:
    """The shared test-session SparkSession with the test tables as temporary views, in UTC.

    The session is the one every integration test uses (tests/conftest.py); the views and the
    time zone are put back as they were when the module is done.
    """
    from pyspark.sql import functions as F

    previous_time_zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    orders = spark.createDataFrame(ORDERS_ROWS, ORDERS_SCHEMA).withColumn("ts", F.col("ts").cast("timestamp"))
    frames = {
        "tt_orders": orders,
        "tt_order_lines": spark.createDataFrame(LINES_ROWS, "order_id INT, sku STRING, n INT"),
        "tt_my_table": spark.createDataFrame(MY_TABLE_ROWS, '`Weird"Col` INT, `UP` STRING'),
    }
    for view, frame in frames.items():
        frame.createOrReplaceTempView(view)
    try:
        yield spark
    finally:
        for view in frames:
            spark.catalog.dropTempView(view)
        spark.conf.set("spark.sql.session.timeZone", previous_time_zone)


def run_on_spark(session: Any, pg_sql: str, column_types: Any = None) -> list[tuple[Any, ...]]:
    """Translate, run on Spark and return the rows (timestamps as UTC text)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampNTZType, TimestampType

    from pgtrickle.spark.numeric import ensure_functions

    text = spark_sql(pg_sql, column_types)
    ensure_functions(session, text)  # numeric quotients call pgtrickle's row function
    frame = session.sql(text)
    columns = [
        F.col(f"`{field.name}`").cast("string").alias(field.name)
        if isinstance(field.dataType, (TimestampType, TimestampNTZType))
        else F.col(f"`{field.name}`")
        for field in frame.schema.fields
    ]
    return [tuple(row) for row in frame.select(*columns).collect()]


D = Decimal

#: (name, normalised PostgreSQL query, rows PostgreSQL returns, whether order matters)
SPARK_CASES: list[tuple[str, str, list[tuple[Any, ...]], bool]] = [
    (
        "integer_division_and_modulo",
        """ SELECT id,
    id / qty AS q,
    '-7'::integer / 2 AS c,
    qty % 3 AS m,
    id / 2 / 2 AS n
   FROM public.orders
  WHERE qty <> 0;""",
        [
            (1, 0, -3, 0, 0),
            (2, 0, -3, 1, 0),
            (3, 0, -3, -1, 0),
            (4, 2, -3, 2, 1),
            (6, 0, -3, 1, 1),
            (7, 1, -3, 1, 1),
        ],
        False,
    ),
    (
        "integer_division_of_aggregates",
        """ SELECT customer,
    sum(qty) / count(*) AS per,
    sum(amount) / 2::numeric AS half
   FROM public.orders
  GROUP BY customer;""",
        [
            (None, 2, None),
            ("bob", 7, D("5")),
            ("carol", None, D("50")),
            ("Dave", 4, D("-1.875")),
            ("alice", -2, D("18.875")),
        ],
        False,
    ),
    (
        "exact_decimal_arithmetic",
        """ SELECT id,
    amount * qty::numeric AS a,
    amount + 0.005 AS b,
    price * amount AS c
   FROM public.orders
  WHERE amount > 10::numeric;""",
        [
            (1, D("76.50"), D("25.505"), D("38.250")),
            (3, D("-85.75"), D("12.255"), D("24.50")),
            (5, None, D("100.005"), D("1012.5")),
        ],
        False,
    ),
    (
        "casts_round_like_postgresql",
        """ SELECT id,
    amount::integer AS ai,
    f::integer AS fi,
    round(f) AS rf,
    customer::character varying(3) AS c3,
    id::text || '#'::text AS t,
    '12.5'::numeric AS n
   FROM public.orders
  WHERE id < 4;""",
        [
            (1, 26, 2, 2.0, "ali", "1#", D("12.5")),
            (2, 5, 4, 4.0, "bob", "2#", D("12.5")),
            (3, 12, -2, -2.0, "ali", "3#", D("12.5")),
        ],
        False,
    ),
    (
        "string_concatenation",
        """ SELECT id,
    (customer || '-'::text) || status::text AS a,
    concat(customer, '-', status, flag) AS b,
    concat_ws('/'::text, customer, id) AS c
   FROM public.orders
  WHERE id = ANY (ARRAY[1, 4, 5]);""",
        [
            (1, "alice-open", "alice-opent", "alice/1"),
            (4, None, "-opent", "4"),
            (5, None, "carol-f", "carol/5"),
        ],
        False,
    ),
    (
        "like_and_ilike",
        """ SELECT id
   FROM public.orders
  WHERE customer ~~* 'A%'::text OR customer ~~ '_o%'::text;""",
        [(1,), (2,), (3,), (6,)],
        False,
    ),
    (
        "coalesce_nullif_case",
        """ SELECT id,
    COALESCE(customer, status::text, 'none'::text) AS a,
    NULLIF(qty, 7) AS b,
        CASE
            WHEN qty > 3 THEN 'big'::text
            WHEN qty > 0 THEN 'small'::text
            ELSE NULL::text
        END AS c
   FROM public.orders;""",
        [
            (1, "alice", 3, "small"),
            (2, "bob", None, "big"),
            (3, "alice", -7, None),
            (4, "open", 2, "small"),
            (5, "carol", None, None),
            (6, "bob", None, "big"),
            (7, "Dave", 4, "big"),
        ],
        False,
    ),
    ("distinct", " SELECT DISTINCT status\n   FROM public.orders;", [(None,), ("open",), ("closed",)], False),
    (
        "union",
        """ SELECT orders.customer
   FROM public.orders
UNION
 SELECT order_lines.sku AS customer
   FROM public.order_lines;""",
        [(None,), ("bob",), ("alice",), ("Dave",), ("z",), ("carol",), ("a",), ("b",), ("c",)],
        False,
    ),
    (
        "intersect_all_union_all_except_all",
        """(
         SELECT order_lines.order_id
           FROM public.order_lines
        INTERSECT ALL
         SELECT orders.id AS order_id
           FROM public.orders
) UNION ALL (
         SELECT order_lines.order_id
           FROM public.order_lines
        EXCEPT ALL
         SELECT orders.id AS order_id
           FROM public.orders
);""",
        [(3,), (5,), (2,), (1,), (9,), (2,), (1,)],
        False,
    ),
    (
        "cte_and_subquery_in_from",
        """ WITH totals AS (
         SELECT orders.customer,
            sum(orders.qty) AS total
           FROM public.orders
          GROUP BY orders.customer
        )
 SELECT customer,
    total
   FROM ( SELECT totals.customer,
            totals.total
           FROM totals
          WHERE totals.total > 0) t;""",
        [(None, 2), ("bob", 14), ("Dave", 4)],
        False,
    ),
    (
        "exists_in_and_not_in_subqueries",
        """ SELECT id
   FROM public.orders o
  WHERE (EXISTS ( SELECT 1
           FROM public.order_lines l
          WHERE l.order_id = o.id)) AND (status::text = ANY (ARRAY['open'::character varying, 'closed'::character varying]::text[])) AND NOT (id IN ( SELECT order_lines.order_id
           FROM public.order_lines
          WHERE order_lines.n > 4));""",
        [(1,), (3,)],
        False,
    ),
    (
        "not_in_with_null_is_empty",
        """ SELECT id
   FROM public.orders
  WHERE NOT (id IN ( SELECT order_lines.n
           FROM public.order_lines));""",
        [],
        False,
    ),
    (
        "aggregates",
        """ SELECT customer,
    count(*) AS n,
    count(DISTINCT status) AS ds,
    sum(qty) AS s,
    min(amount) AS mn,
    max(amount) AS mx,
    bool_and(flag) AS ba,
    bool_or(flag) AS bo,
    string_agg(status::text, ','::text ORDER BY id) AS st
   FROM public.orders
  GROUP BY customer;""",
        [
            ("Dave", 1, 1, 4, D("-3.75"), D("-3.75"), True, True, "open"),
            ("alice", 2, 1, -4, D("12.25"), D("25.50"), True, True, "open,open"),
            ("bob", 2, 1, 14, D("5.00"), D("5.00"), False, False, "closed,closed"),
            ("carol", 1, 0, None, D("100.00"), D("100.00"), False, False, None),
            (None, 1, 1, 2, None, None, True, True, "open"),
        ],
        False,
    ),
    (
        "aggregates_over_no_rows",
        """ SELECT count(*) AS n,
    sum(qty) AS s,
    max(customer) AS m,
    string_agg(customer, ','::text) AS a
   FROM public.orders
  WHERE id > 100;""",
        [(0, None, None, None)],
        False,
    ),
    (
        "date_trunc_and_extract",
        """ SELECT id,
    date_trunc('day'::text, ts) AS day,
    EXTRACT(dow FROM ts) AS dow,
    EXTRACT(epoch FROM ts) AS ep,
    EXTRACT(year FROM d) AS y
   FROM public.orders
  WHERE id = ANY (ARRAY[1, 2, 4]);""",
        [
            (1, "2024-01-15 00:00:00", 1, D("1705314600"), 2024),
            (2, "2024-01-16 00:00:00", 2, D("1705449599.5"), 2024),
            (4, None, None, None, None),
        ],
        False,
    ),
    (
        "order_by_nulls_last_with_limit_offset",
        """ SELECT id,
    qty
   FROM public.orders
  ORDER BY qty DESC, id
 OFFSET 1
 LIMIT 4;""",
        [(2, 7), (6, 7), (7, 4), (1, 3)],
        True,
    ),
    (
        "order_by_puts_nulls_last",
        """ SELECT customer,
    id
   FROM public.orders
  ORDER BY customer, id;""",
        [("Dave", 7), ("alice", 1), ("alice", 3), ("bob", 2), ("bob", 6), ("carol", 5), (None, 4)],
        True,
    ),
    (
        "window_functions",
        """ SELECT id,
    row_number() OVER (PARTITION BY customer ORDER BY amount, id) AS rn,
    sum(qty) OVER (ORDER BY id) AS run,
    lag(id) OVER (ORDER BY id) AS prev
   FROM public.orders;""",
        [
            (7, 1, 16, 6),
            (3, 1, 3, 2),
            (1, 2, 3, None),
            (2, 1, 10, 1),
            (6, 2, 12, 5),
            (5, 1, 5, 4),
            (4, 1, 5, 3),
        ],
        False,
    ),
    (
        "full_join",
        """ SELECT o.id,
    l.sku
   FROM public.orders o
     FULL JOIN public.order_lines l ON l.order_id = o.id
  WHERE o.id IS NULL OR o.id > 4 OR l.order_id IS NULL;""",
        [(None, "z"), (5, "c"), (6, None), (4, None), (7, None)],
        False,
    ),
    (
        "left_cross_right_joins_and_quoted_names",
        """ SELECT o.id,
    l.n,
    m."UP"
   FROM public.orders o
     LEFT JOIN public.order_lines l ON l.order_id = o.id AND l.n > 1
     CROSS JOIN public."My Table" m
     RIGHT JOIN ( SELECT 1 AS k) k ON k.k = m."Weird""Col"
  WHERE o.id < 3;""",
        [(1, 2, "x"), (2, 5, "x"), (2, 5, "x")],
        False,
    ),
    (
        "distinct_on",
        """ SELECT DISTINCT ON (customer) customer,
    id,
    amount
   FROM public.orders
  ORDER BY customer, amount DESC NULLS LAST, id DESC;""",
        [
            ("Dave", 7, D("-3.75")),
            ("alice", 1, D("25.50")),
            ("bob", 6, D("5.00")),
            ("carol", 5, D("100.00")),
            (None, 4, None),
        ],
        False,
    ),
    (
        "quoted_identifiers",
        """ SELECT "Weird""Col" AS w,
    count(*) AS n
   FROM public."My Table" m
  GROUP BY "Weird""Col";""",
        [(2, 2), (1, 1)],
        False,
    ),
    (
        "double_to_numeric_keeps_15_digits",
        """ SELECT id,
    (f + 0.2::double precision)::numeric AS x,
    f::numeric(10,3) AS y
   FROM public.orders
  WHERE id = 5;""",
        [(5, D("0.3"), D("0.1"))],
        False,
    ),
    (
        "text_functions_with_postgresql_positions",
        """ SELECT id,
    regexp_replace(customer, '[ab]'::text, 'X'::text) AS r,
    "substring"(customer, 0, 3) AS s,
    "left"(customer, '-1'::integer) AS l,
    "position"(customer, 'o'::text) AS p
   FROM public.orders
  WHERE id = ANY (ARRAY[4, 5, 7]);""",
        [(4, None, None, None, None), (5, "cXrol", "ca", "caro", 4), (7, "DXve", "Da", "Dav", 0)],
        False,
    ),
    (
        "trunc_log_round",
        """ SELECT id,
    trunc(amount) AS t,
    trunc('-2.75'::numeric, 1) AS tn,
    log(100::double precision) AS lg,
    round('-2.5'::numeric) AS r
   FROM public.orders
  WHERE id = 1;""",
        [(1, D("25"), D("-2.7"), 2.0, D("-3"))],
        False,
    ),
]


def _same_rows(actual: list[tuple[Any, ...]], expected: list[tuple[Any, ...]], ordered: bool) -> bool:
    """Compare like PostgreSQL's EXCEPT ALL would: by value, as a multiset unless order matters."""
    if ordered:
        return actual == expected
    return Counter(actual) == Counter(expected)


@pytest.mark.parametrize("with_types", [False, True], ids=["untyped", "typed"])
@pytest.mark.parametrize(
    ("name", "pg_sql", "expected", "ordered"), SPARK_CASES, ids=[c[0] for c in SPARK_CASES]
)
def test_spark_returns_postgresql_rows(
    views: Any, name: str, pg_sql: str, expected: list[tuple[Any, ...]], ordered: bool, with_types: bool
) -> None:
    rows = run_on_spark(views, pg_sql, COLUMN_TYPES if with_types else None)
    assert _same_rows(rows, expected, ordered), f"{name}: {rows!r} != {expected!r}"


def test_spark_integer_division_keeps_integer_type_with_column_types(views: Any) -> None:
    rows = run_on_spark(
        views,
        " SELECT id / qty AS q,\n    big / 2 AS b\n   FROM public.orders\n  WHERE id = 2;",
        COLUMN_TYPES,
    )
    assert rows == [(0, -3)]
    assert all(isinstance(value, int) for value in rows[0])


def test_spark_division_by_zero_fails_like_postgresql(views: Any) -> None:
    with pytest.raises(Exception, match="DIVIDE_BY_ZERO"):
        run_on_spark(views, " SELECT orders.id / (orders.qty - orders.qty) AS x\n   FROM public.orders;")


def test_spark_runs_volatile_query(views: Any) -> None:
    text = " SELECT count(*) AS n\n   FROM public.orders\n  WHERE ts < now() AND d <= CURRENT_DATE;"
    assert is_volatile(text)
    assert run_on_spark(views, text) == [(6,)]
