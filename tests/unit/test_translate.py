"""Tests of the PostgreSQL -> Spark SQL translation (pgtrickle.sql.translate).

The first part checks the functions on query strings only.  The second part
(marked ``spark``) runs translated queries on a real local SparkSession over
small temporary views and compares the rows with what PostgreSQL returns for
the same data (written down by hand).  Query texts are in the normalised form
``pg_get_viewdef(view, true)`` produces with ``search_path = pg_catalog``.
"""

from __future__ import annotations

import re
from decimal import Decimal, localcontext
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgtrickle.errors import UnsupportedQueryError
from pgtrickle.sql.translate import (
    is_volatile,
    parse_query,
    referenced_tables,
    translate_to_spark,
    unsupported_reason,
)

TABLE_MAP = {
    ("public", "orders"): "tt_orders",
    ("public", "order_lines"): "tt_order_lines",
    ("public", "My Table"): "tt_my_table",
}

ORDERS_COLUMNS = {
    "id": "integer",
    "customer": "text",
    "status": "character varying(10)",
    "amount": "numeric(10,2)",
    "qty": "integer",
    "price": "numeric",
    "ts": "timestamp with time zone",
    "d": "date",
    "flag": "boolean",
    "f": "double precision",
    "big": "bigint",
    "sm": "smallint",
}
COLUMN_TYPES = {
    ("public", "orders"): ORDERS_COLUMNS,
    ("public", "order_lines"): {"order_id": "integer", "sku": "text", "n": "integer"},
    ("public", "My Table"): {'Weird"Col': "integer", "UP": "text"},
}


def spark_sql(pg_sql: str, column_types: Any = None) -> str:
    """Translate with the test table map."""
    return translate_to_spark(pg_sql, TABLE_MAP, column_types)


def squash(sql: str) -> str:
    """Collapse whitespace so assertions do not depend on pretty-printing."""
    return re.sub(r"\s+", " ", sql).replace("( ", "(").replace(" )", ")").strip()


def translated(pg_sql: str, column_types: Any = None) -> str:
    """Translated Spark SQL with whitespace collapsed."""
    return squash(spark_sql(pg_sql, column_types))


# --------------------------------------------------------------------------- parse_query


def test_parse_query_accepts_select_with_trailing_semicolon() -> None:
    query = parse_query(" SELECT o.id\n   FROM public.orders o;\n")
    assert query.key == "select"


def test_parse_query_accepts_set_operation() -> None:
    query = parse_query(" SELECT 1 AS x\nUNION ALL\n SELECT 2 AS x;")
    assert query.key == "union"


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("INSERT INTO public.t VALUES (1)", "INSERT"),
        ("UPDATE public.t SET a = 1", "UPDATE"),
        ("DELETE FROM public.t", "DELETE"),
        ("CREATE TABLE public.t (a integer)", "CREATE"),
    ],
)
def test_parse_query_rejects_non_queries_naming_them(text: str, found: str) -> None:
    with pytest.raises(UnsupportedQueryError, match=found):
        parse_query(text)


def test_parse_query_rejects_several_statements() -> None:
    with pytest.raises(UnsupportedQueryError, match="single statement, found 2"):
        parse_query("SELECT 1; SELECT 2;")


def test_parse_query_rejects_empty_and_garbage() -> None:
    with pytest.raises(UnsupportedQueryError, match="empty"):
        parse_query("  ;  ")
    with pytest.raises(UnsupportedQueryError, match="could not be parsed"):
        parse_query("SELECT FROM WHERE (")


def test_parse_query_rejects_select_into() -> None:
    with pytest.raises(UnsupportedQueryError, match="INTO"):
        parse_query("SELECT 1 AS a INTO public.t")


# --------------------------------------------------------------------------- referenced_tables


def test_referenced_tables_in_first_appearance_order_without_duplicates() -> None:
    sql = """ SELECT o.customer,
    sum(o.amount) AS total
   FROM public.orders o
     JOIN public.order_lines l ON l.order_id = o.id
     JOIN public.orders o2 ON o2.id = l.order_id
  GROUP BY o.customer;"""
    assert referenced_tables(sql) == [("public", "orders"), ("public", "order_lines")]


def test_referenced_tables_excludes_cte_names_and_includes_subqueries() -> None:
    sql = """ WITH recent AS (
         SELECT orders.id
           FROM sales.orders
          WHERE orders.id > 10
        )
 SELECT r.id
   FROM recent r
  WHERE (EXISTS ( SELECT 1
           FROM public.order_lines l
          WHERE l.order_id = r.id));"""
    assert referenced_tables(sql) == [("sales", "orders"), ("public", "order_lines")]


def test_referenced_tables_keeps_quoted_names_exactly() -> None:
    sql = ' SELECT "Weird""Col"\n   FROM "My Schema"."My Table";'
    assert referenced_tables(sql) == [("My Schema", "My Table")]


def test_referenced_tables_unqualified_name_is_pg_catalog() -> None:
    assert referenced_tables(" SELECT pg_class.relname\n   FROM pg_class;") == [("pg_catalog", "pg_class")]


# --------------------------------------------------------------------------- table replacement


def test_tables_are_replaced_keeping_aliases() -> None:
    sql = translated(
        """ SELECT o.customer
   FROM public.orders o
     JOIN public.order_lines l ON l.order_id = o.id;"""
    )
    assert "FROM tt_orders AS o JOIN tt_order_lines AS l ON l.order_id = o.id" in sql
    assert "public." not in sql


def test_unaliased_table_is_aliased_with_its_name() -> None:
    sql = translated(" SELECT orders.amount\n   FROM public.orders\n  WHERE orders.id > 1;")
    assert "FROM tt_orders AS orders" in sql
    assert "orders.amount" in sql


def test_quoted_identifiers_become_backticks() -> None:
    sql = translated(' SELECT "Weird""Col",\n    "UP"\n   FROM public."My Table";')
    assert sql == 'SELECT `Weird"Col`, `UP` FROM tt_my_table AS `My Table`'


def test_cte_references_are_not_replaced() -> None:
    sql = translated(
        """ WITH t AS (
         SELECT orders.id
           FROM public.orders
        )
 SELECT t.id
   FROM t;"""
    )
    assert "FROM t" in sql
    assert "FROM tt_orders AS orders" in sql


def test_missing_view_is_an_error() -> None:
    with pytest.raises(UnsupportedQueryError, match=r"public\.customers"):
        spark_sql(" SELECT customers.id\n   FROM public.customers;")


# --------------------------------------------------------------------------- semantics: arithmetic


def test_integer_division_with_known_types_uses_div() -> None:
    sql = translated(" SELECT id / qty AS q,\n    big / 2 AS b\n   FROM public.orders;", COLUMN_TYPES)
    assert "CAST(id DIV qty AS INT) AS q" in sql
    assert "big DIV 2 AS b" in sql


def test_integer_division_of_constants_truncates() -> None:
    sql = translated(" SELECT 7 / 2 AS a,\n    '-7'::integer / 2 AS b;")
    assert "CAST(7 DIV 2 AS INT) AS a" in sql
    assert "CAST(CAST('-7' AS INT) DIV 2 AS INT) AS b" in sql


def test_integer_division_with_unknown_types_is_decided_at_run_time() -> None:
    sql = translated(" SELECT id / qty AS q\n   FROM public.orders;")
    assert "TYPEOF(id) IN ('tinyint', 'smallint', 'int', 'bigint')" in sql
    assert "THEN CAST(id AS BIGINT) DIV CAST(qty AS BIGINT) ELSE id / qty END AS q" in sql


def test_division_with_a_numeric_operand_is_fractional() -> None:
    sql = translated(
        " SELECT amount / qty::numeric AS a,\n    f / 2::double precision AS b\n   FROM public.orders;",
        COLUMN_TYPES,
    )
    # numeric: PostgreSQL's quotient by the row function, cast to a decimal that holds it
    assert "CAST(PGT_NUMERIC_DIV(amount, CAST(qty AS DECIMAL(10, 0)), 2, 0, 30, 8," in sql
    assert "AS DECIMAL(38, 30)) AS a" in sql
    assert "f / CAST(2 AS DOUBLE) AS b" in sql
    assert " DIV " not in sql


def test_sum_of_bigint_is_numeric_so_its_division_is_fractional() -> None:
    sql = translated(
        " SELECT sum(big) / count(*) AS a,\n    sum(qty) / count(*) AS b\n   FROM public.orders;",
        COLUMN_TYPES,
    )
    assert (
        "PGT_NUMERIC_DIV(SUM(big), COUNT(*), 0, 0, 20, 18, 'SUM(big) / COUNT(*)') AS DECIMAL(38, 20)) AS a"
        in sql
    )
    assert "SUM(qty) DIV COUNT(*) AS b" in sql


def test_numeric_constants_keep_their_exact_precision() -> None:
    sql = translated(
        " SELECT amount\n   FROM public.orders\n  WHERE amount > 10::numeric AND price < '-0.5'::numeric;"
    )
    assert "amount > CAST('10' AS DECIMAL(2, 0))" in sql
    assert "price < CAST('-0.5' AS DECIMAL(1, 1))" in sql


def test_numeric_cast_of_integer_column_is_exact_and_of_unknown_is_38_18() -> None:
    assert "CAST(qty AS DECIMAL(10, 0))" in translated(
        " SELECT qty::numeric AS x\n   FROM public.orders;", COLUMN_TYPES
    )
    assert "CAST(qty AS DECIMAL(38, 18))" in translated(" SELECT qty::numeric AS x\n   FROM public.orders;")


def test_numeric_cast_of_numeric_column_is_dropped() -> None:
    sql = translated(" SELECT amount::numeric AS x\n   FROM public.orders;", COLUMN_TYPES)
    assert sql == "SELECT amount AS x FROM tt_orders AS orders"


def test_numeric_cast_with_typmod_and_from_double() -> None:
    sql = translated(
        " SELECT amount::numeric(5,1) AS a,\n    f::numeric AS b\n   FROM public.orders;", COLUMN_TYPES
    )
    assert "CAST(amount AS DECIMAL(5, 1)) AS a" in sql
    assert "CAST(NULLIF(FORMAT_STRING('%.15g', f), 'null') AS DECIMAL(38, 18)) AS b" in sql


@given(st.decimals(allow_nan=False, allow_infinity=False, min_value=-(10**25), max_value=10**25))
def test_numeric_constant_cast_is_exact_or_refused(value: Decimal) -> None:
    text = format(value, "f")
    digits_after_point = len(text.split(".")[1]) if "." in text else 0
    digits_before_point = len(text.lstrip("-").split(".")[0].lstrip("0"))
    pg_sql = f" SELECT '{text}'::numeric AS x;"
    if digits_before_point + digits_after_point > 38:
        assert "38 digits" in (unsupported_reason(pg_sql) or "")
        return
    match = re.search(r"CAST\('(-?[0-9.]+)' AS DECIMAL\((\d+), (\d+)\)\)", translated(pg_sql))
    assert match is not None
    precision, scale = int(match.group(2)), int(match.group(3))
    with localcontext() as context:
        context.prec = 100
        assert Decimal(match.group(1)) == value
        assert scale == digits_after_point
        assert precision == max(digits_before_point + digits_after_point, 1)


# --------------------------------------------------------------------------- semantics: casts


def test_text_casts_of_literals_disappear_and_of_columns_become_string() -> None:
    sql = translated(" SELECT status::text AS s\n   FROM public.orders\n  WHERE status::text = 'open'::text;")
    assert "CAST(status AS STRING) AS s" in sql
    assert "= 'open'" in sql and "CAST('open'" not in sql


def test_varchar_with_length_truncates() -> None:
    sql = translated(" SELECT customer::character varying(3) AS c\n   FROM public.orders;")
    assert "LEFT(CAST(customer AS STRING), 3) AS c" in sql


def test_integer_casts_round_like_postgresql() -> None:
    sql = translated(
        " SELECT amount::integer AS a,\n    f::bigint AS b,\n    id::bigint AS c,\n    '5'::integer AS d\n   FROM public.orders;",
        COLUMN_TYPES,
    )
    assert "CAST(ROUND(amount, 0) AS INT) AS a" in sql
    assert "CAST(BROUND(f, 0) AS BIGINT) AS b" in sql
    assert "CAST(id AS BIGINT) AS c" in sql
    assert "CAST('5' AS INT) AS d" in sql


def test_integer_cast_of_unknown_type_checks_for_floating_point() -> None:
    sql = translated(" SELECT x::integer AS a\n   FROM public.orders;")
    assert "WHEN TYPEOF(x) IN ('float', 'double') THEN CAST(BROUND(CAST(x AS DOUBLE), 0) AS INT)" in sql
    assert "ELSE CAST(CAST(x AS DECIMAL(38, 0)) AS INT) END AS a" in sql


def test_date_time_and_float_casts() -> None:
    sql = translated(
        " SELECT ts::date AS a,\n    d::timestamp with time zone AS b,\n    '2020-01-01 10:00:00'::timestamp without time zone AS c,"
        "\n    id::double precision AS e,\n    sm::real AS g,\n    flag::boolean AS h\n   FROM public.orders;"
    )
    assert "CAST(ts AS DATE) AS a" in sql
    assert "CAST(d AS TIMESTAMP) AS b" in sql
    assert "CAST('2020-01-01 10:00:00' AS TIMESTAMP) AS c" in sql
    assert "CAST(id AS DOUBLE) AS e" in sql
    assert "CAST(sm AS FLOAT) AS g" in sql
    assert "CAST(flag AS BOOLEAN) AS h" in sql


def test_interval_constants_become_make_interval() -> None:
    sql = translated(
        " SELECT ts + '1 year 2 mons 3 days 04:05:06.5'::interval AS a\n   FROM public.orders;", COLUMN_TYPES
    )
    assert "ts + MAKE_INTERVAL(1, 2, 0, 3, 4, 5, 6.5) AS a" in sql


def test_date_minus_date_counts_days() -> None:
    sql = translated(" SELECT d - '2024-01-01'::date AS a\n   FROM public.orders;")
    assert "DATEDIFF(d, CAST('2024-01-01' AS DATE)) AS a" in sql


# --------------------------------------------------------------------------- semantics: text


def test_concatenation_operator_propagates_nulls_like_postgresql() -> None:
    sql = translated(" SELECT (customer || '-'::text) || status::text AS a\n   FROM public.orders;")
    assert "(customer || '-') || CAST(status AS STRING) AS a" in sql


def test_concat_function_skips_nulls_and_prints_booleans_as_t_f() -> None:
    sql = translated(" SELECT concat(customer, '-', flag, id) AS a\n   FROM public.orders;", COLUMN_TYPES)
    assert "CONCAT_WS('', customer, '-', LEFT(CAST(flag AS STRING), 1), CAST(id AS STRING)) AS a" in sql


def test_like_and_ilike_operators() -> None:
    sql = translated(
        " SELECT orders.id\n   FROM public.orders\n  WHERE customer ~~* 'a%'::text OR customer ~~ '_o%'::text"
        " OR customer !~~* '%x'::text;"
    )
    assert "customer ILIKE 'a%'" in sql
    assert "customer LIKE '_o%'" in sql
    assert "customer NOT ILIKE '%x'" in sql


def test_regular_expressions_match_newlines_like_postgresql() -> None:
    sql = translated(
        " SELECT orders.id\n   FROM public.orders\n  WHERE customer ~ '^a.b'::text OR customer ~* 'x'::text;"
    )
    assert "customer RLIKE '(?s)^a.b'" in sql
    assert "customer RLIKE '(?is)x'" in sql


def test_regexp_replace_without_g_flag_replaces_the_first_match_only() -> None:
    sql = translated(
        " SELECT regexp_replace(customer, '[ab]'::text, 'X'::text) AS a,\n"
        "    regexp_replace(customer, '(l)(i)'::text, '\\2\\1'::text, 'g'::text) AS b\n   FROM public.orders;"
    )
    assert "REGEXP_REPLACE(customer, '(?s)^(.*?)([ab])', '$1X') AS a" in sql
    assert "REGEXP_REPLACE(customer, '(?s)(l)(i)', '$2$1') AS b" in sql


def test_position_function_keeps_postgresql_argument_order() -> None:
    sql = translated(
        " SELECT \"position\"(customer, 'o'::text) AS a,\n    POSITION(('o'::text) IN (customer)) AS b\n   FROM public.orders;"
    )
    assert "LOCATE('o', customer) AS a" in sql
    assert "LOCATE(('o'), (customer)) AS b" in sql


def test_substring_with_non_positive_start_follows_postgresql() -> None:
    sql = translated(
        ' SELECT "substring"(customer, 0, 3) AS a,\n    "substring"(customer, 2, 3) AS b\n   FROM public.orders;'
    )
    assert "SUBSTRING(customer, GREATEST(0, 1), GREATEST((0) + (3) - GREATEST(0, 1), 0)) AS a" in sql
    assert "SUBSTRING(customer, 2, 3) AS b" in sql


def test_string_agg_becomes_listagg_with_explicit_null_ordering() -> None:
    sql = translated(" SELECT string_agg(status::text, ','::text ORDER BY id) AS s\n   FROM public.orders;")
    assert "LISTAGG(CAST(status AS STRING), ',') WITHIN GROUP (ORDER BY id NULLS LAST) AS s" in sql


# --------------------------------------------------------------------------- semantics: other constructs


def test_coalesce_nullif_case() -> None:
    sql = translated(
        """ SELECT COALESCE(customer, status::text, 'none'::text) AS a,
    NULLIF(qty, 7) AS b,
        CASE
            WHEN qty > 3 THEN 'big'::text
            ELSE NULL::text
        END AS c
   FROM public.orders;"""
    )
    assert "COALESCE(customer, CAST(status AS STRING), 'none') AS a" in sql
    assert "NULLIF(qty, 7) AS b" in sql
    assert "CASE WHEN qty > 3 THEN 'big' ELSE CAST(NULL AS STRING) END AS c" in sql


def test_distinct_and_set_operations() -> None:
    sql = translated(
        """ SELECT DISTINCT orders.customer
   FROM public.orders
UNION ALL
 SELECT order_lines.sku AS customer
   FROM public.order_lines
INTERSECT ALL
 SELECT orders.status AS customer
   FROM public.orders
EXCEPT
 SELECT 'x'::text AS customer;"""
    )
    assert sql.startswith("SELECT DISTINCT orders.customer FROM tt_orders AS orders UNION ALL")
    assert "INTERSECT ALL" in sql
    assert "EXCEPT SELECT 'x' AS customer" in sql


def test_subqueries_ctes_exists_and_in() -> None:
    sql = translated(
        """ WITH totals AS (
         SELECT orders.customer, sum(orders.qty) AS total
           FROM public.orders
          GROUP BY orders.customer
        )
 SELECT t.customer
   FROM ( SELECT totals.customer
           FROM totals) t
  WHERE (EXISTS ( SELECT 1
           FROM public.order_lines l
          WHERE l.sku = t.customer)) AND (t.customer IN ( SELECT orders.status
           FROM public.orders));"""
    )
    assert "WITH totals AS (SELECT orders.customer, SUM(orders.qty) AS total FROM tt_orders AS orders" in sql
    assert "FROM (SELECT totals.customer FROM totals) AS t" in sql
    assert "EXISTS(SELECT 1 FROM tt_order_lines AS l WHERE l.sku = t.customer)" in sql
    assert "t.customer IN (SELECT orders.status FROM tt_orders AS orders)" in sql


def test_any_array_becomes_in_list_and_all_becomes_not_in() -> None:
    sql = translated(
        " SELECT orders.id\n   FROM public.orders\n  WHERE status::text = ANY (ARRAY['a'::character varying, "
        "'b'::character varying]::text[]) AND id <> ALL (ARRAY[1, 2]) AND qty > ANY (ARRAY[3, 4]);"
    )
    assert "(CAST(status AS STRING) IN ('a', 'b'))" in sql
    assert "(NOT (id IN (1, 2)))" in sql
    assert "(qty > 3 OR qty > 4)" in sql


def test_any_subquery_becomes_in() -> None:
    sql = translated(
        " SELECT orders.id\n   FROM public.orders\n  WHERE id = ANY (SELECT order_lines.order_id FROM public.order_lines);"
    )
    assert "(id IN (SELECT order_lines.order_id FROM tt_order_lines AS order_lines))" in sql


def test_aggregates() -> None:
    sql = translated(
        """ SELECT customer,
    count(*) AS n,
    count(DISTINCT status) AS ds,
    sum(qty) AS s,
    avg(qty) AS a,
    min(amount) AS mn,
    max(amount) AS mx,
    bool_and(flag) AS ba,
    bool_or(flag) AS bo
   FROM public.orders
  GROUP BY customer
 HAVING count(*) > 1;"""
    )
    for fragment in (
        "COUNT(*) AS n",
        "COUNT(DISTINCT status) AS ds",
        "SUM(qty) AS s",
        "AVG(qty) AS a",
        "MIN(amount) AS mn",
        "MAX(amount) AS mx",
        "BOOL_AND(flag) AS ba",
        "BOOL_OR(flag) AS bo",
        "GROUP BY customer HAVING COUNT(*) > 1",
    ):
        assert fragment in sql


def test_percentiles_stay_exact() -> None:
    sql = translated(" SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY qty) AS p\n   FROM public.orders;")
    assert "PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY qty NULLS LAST) AS p" in sql
    assert "APPROX" not in sql


def test_date_trunc_and_extract() -> None:
    sql = translated(
        " SELECT date_trunc('day'::text, ts) AS a,\n    EXTRACT(year FROM ts) AS b,\n    EXTRACT(dow FROM ts) AS c,"
        "\n    EXTRACT(epoch FROM ts) AS e,\n    date_part('isodow'::text, ts) AS g\n   FROM public.orders;"
    )
    assert "DATE_TRUNC('DAY', ts) AS a" in sql
    assert "EXTRACT(YEAR FROM ts) AS b" in sql
    assert "(EXTRACT(DOW FROM ts) - 1) AS c" in sql
    assert "(CAST(UNIX_MICROS(CAST(ts AS TIMESTAMP)) AS DECIMAL(20, 0)) / 1000000) AS e" in sql
    assert "EXTRACT(DOW_ISO FROM ts) AS g" in sql


def test_now_and_current_timestamp_translate_and_are_volatile() -> None:
    text = " SELECT orders.id\n   FROM public.orders\n  WHERE ts < now() AND ts < CURRENT_TIMESTAMP;"
    assert "ts < CURRENT_TIMESTAMP() AND ts < CURRENT_TIMESTAMP()" in translated(text)
    assert is_volatile(text)


def test_log_round_trunc() -> None:
    sql = translated(
        " SELECT log(f) AS a,\n    round(f) AS b,\n    round(amount, 1) AS c,\n    trunc(amount) AS e\n   FROM public.orders;",
        COLUMN_TYPES,
    )
    assert "LOG10(f) AS a" in sql
    assert "BROUND(f, 0) AS b" in sql
    assert "ROUND(amount, 1) AS c" in sql
    assert "CASE WHEN amount < 0 THEN CEIL(amount, 0) ELSE FLOOR(amount, 0) END AS e" in sql


def test_order_by_limit_offset_with_explicit_null_ordering() -> None:
    sql = translated(
        " SELECT orders.id\n   FROM public.orders\n  ORDER BY customer, qty DESC, id NULLS FIRST, amount DESC NULLS LAST\n OFFSET 1\n LIMIT 5;"
    )
    # Spark already sorts NULLs first ascending and last descending, so those stay implicit.
    assert "ORDER BY customer NULLS LAST, qty DESC NULLS FIRST, id, amount DESC LIMIT" in sql
    assert sql.endswith("LIMIT 5 OFFSET 1")


def test_window_functions_get_explicit_null_ordering() -> None:
    sql = translated(
        " SELECT row_number() OVER (PARTITION BY customer ORDER BY amount DESC) AS rn,\n"
        "    sum(qty) OVER (ORDER BY id ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS s\n   FROM public.orders;"
    )
    assert "ROW_NUMBER() OVER (PARTITION BY customer ORDER BY amount DESC NULLS FIRST) AS rn" in sql
    assert "SUM(qty) OVER (ORDER BY id NULLS LAST ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS s" in sql


def test_outer_and_cross_joins() -> None:
    sql = translated(
        """ SELECT o.id
   FROM public.orders o
     LEFT JOIN public.order_lines l ON l.order_id = o.id
     RIGHT JOIN public.order_lines l2 ON l2.order_id = o.id
     FULL JOIN public.order_lines l3 ON l3.order_id = o.id
     CROSS JOIN public."My Table" m;"""
    )
    assert "LEFT JOIN tt_order_lines AS l ON l.order_id = o.id" in sql
    assert "RIGHT JOIN tt_order_lines AS l2" in sql
    assert "FULL JOIN tt_order_lines AS l3" in sql
    assert "CROSS JOIN tt_my_table AS m" in sql


def test_distinct_on_becomes_row_number_filter() -> None:
    sql = translated(
        " SELECT DISTINCT ON (customer) customer,\n    id\n   FROM public.orders\n  ORDER BY customer, id DESC\n LIMIT 3;"
    )
    assert (
        "ROW_NUMBER() OVER (PARTITION BY customer ORDER BY customer NULLS LAST, id DESC NULLS FIRST) AS _pgt_row"
        in sql
    )
    assert "WHERE _pgt_row = 1 ORDER BY _pgt_sort0 NULLS LAST, _pgt_sort1 DESC NULLS FIRST LIMIT 3" in sql
    assert "DISTINCT" not in sql


def test_column_types_accept_spark_type_names() -> None:
    spark_types = {("public", "orders"): {"id": "int", "qty": "int", "amount": "decimal(10,2)"}}
    sql = translated(" SELECT id / qty AS a,\n    amount::integer AS b\n   FROM public.orders;", spark_types)
    assert "CAST(id DIV qty AS INT) AS a" in sql
    assert "CAST(ROUND(amount, 0) AS INT) AS b" in sql


def test_dollar_brace_is_refused_because_spark_would_substitute_it() -> None:
    with pytest.raises(UnsupportedQueryError, match="variable"):
        spark_sql(" SELECT '${x}'::text AS a\n   FROM public.orders;")


# --------------------------------------------------------------------------- unsupported_reason


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            " WITH RECURSIVE r(n) AS (\n         SELECT 1\n        UNION ALL\n         SELECT r_1.n + 1\n"
            "           FROM r r_1\n          WHERE r_1.n < 3\n        )\n SELECT r.n\n   FROM r;",
            "WITH RECURSIVE",
        ),
        (" SELECT orders.id\n   FROM public.orders\n FOR UPDATE OF orders;", "FOR UPDATE"),
        (" SELECT generate_series(1, orders.id) AS g\n   FROM public.orders;", "generate_series()"),
        (" SELECT g.g\n   FROM generate_series(1, 3) g(g);", "generate_series()"),
        (" SELECT unnest(ARRAY[1, 2]) AS u\n   FROM public.orders;", "unnest()"),
        (
            " SELECT o.id,\n    x.c\n   FROM public.orders o,\n    LATERAL ( SELECT count(*) AS c\n"
            "           FROM public.order_lines l\n          WHERE l.order_id = o.id) x;",
            "LATERAL",
        ),
        (" SELECT my_custom_fn(orders.id) AS x\n   FROM public.orders;", "my_custom_fn()"),
        (" SELECT age(orders.ts) AS x\n   FROM public.orders;", "age()"),
        (" SELECT nextval('s'::regclass) AS x\n   FROM public.orders;", "nextval()"),
        (" SELECT array_agg(orders.id) AS x\n   FROM public.orders;", "array_agg()"),
        (" SELECT (orders.ts AT TIME ZONE 'UTC'::text) AS x\n   FROM public.orders;", "AT TIME ZONE"),
        (" SELECT orders.id\n   FROM public.orders TABLESAMPLE system (10);", "TABLESAMPLE"),
        (" SELECT orders.id\n   FROM ONLY public.orders;", "ONLY"),
        (" SELECT orders.amount::numeric(50,2) AS x\n   FROM public.orders;", "38 digits"),
        (" SELECT CURRENT_USER AS u\n   FROM public.orders;", "current_user"),
        (" SELECT initcap(orders.customer) AS x\n   FROM public.orders;", "initcap()"),
        (" SELECT to_char(orders.ts, 'Month'::text) AS x\n   FROM public.orders;", "to_char()"),
        (" SELECT orders.id\n   FROM public.orders\n  WHERE orders.qty > ALL (SELECT 1);", "ALL (subquery)"),
        (
            " SELECT orders.customer ~ similar_to_escape('a%'::text) AS x\n   FROM public.orders;",
            "similar_to_escape()",
        ),
        (" SELECT (orders.j ->> 'a'::text) AS x\n   FROM public.orders;", "JSON"),
        (
            " SELECT regexp_replace(orders.customer, 'a'::text, 'b'::text, 'x'::text) AS x\n   FROM public.orders;",
            "flags",
        ),
        (" SELECT EXTRACT(century FROM orders.ts) AS x\n   FROM public.orders;", "century"),
        (" SELECT '10:00'::time without time zone AS x;", "time"),
        (
            " SELECT o.customer,\n    count(*) AS n,\n    ( SELECT max(l.qty) AS max\n           FROM public.order_lines l\n"
            "          WHERE l.order_id = o.customer) AS top\n   FROM public.orders o\n  GROUP BY o.customer;",
            "correlated scalar subquery in the output list of a GROUP BY",
        ),
    ],
)
def test_unsupported_reason_names_the_construct(text: str, expected: str) -> None:
    reason = unsupported_reason(text)
    assert reason is not None
    assert expected.lower() in reason.lower()
    with pytest.raises(UnsupportedQueryError) as raised:
        spark_sql(text)
    assert str(raised.value) == reason


def test_unsupported_reason_is_none_for_supported_queries() -> None:
    assert unsupported_reason(" SELECT orders.id\n   FROM public.orders\n  WHERE orders.qty > 1;") is None
    # uncorrelated, or correlated outside a GROUP BY: Spark runs them
    assert (
        unsupported_reason(
            " SELECT o.customer, count(*) AS n, ( SELECT max(l.qty) AS max FROM public.order_lines l)"
            " AS top FROM public.orders o GROUP BY o.customer"
        )
        is None
    )
    assert (
        unsupported_reason(
            " SELECT o.id, ( SELECT max(l.qty) AS max FROM public.order_lines l"
            " WHERE l.order_id = o.id) AS top FROM public.orders o"
        )
        is None
    )
    # random() is volatile (no DIFFERENTIAL) but runs on Spark: it is not a set-returning function
    assert unsupported_reason(" SELECT orders.id FROM public.orders WHERE random() < 2") is None


def test_unsupported_reason_reports_parse_failures() -> None:
    reason = unsupported_reason("DELETE FROM public.orders")
    assert reason is not None and "DELETE" in reason


# --------------------------------------------------------------------------- is_volatile


@pytest.mark.parametrize(
    "expression",
    [
        "now()",
        "CURRENT_TIMESTAMP",
        "CURRENT_DATE",
        "LOCALTIMESTAMP",
        "clock_timestamp()",
        "random()",
        "statement_timestamp()",
        "nextval('s'::regclass)",
        "gen_random_uuid()",
        "transaction_timestamp()",
    ],
)
def test_is_volatile_detects_time_random_and_sequence_functions(expression: str) -> None:
    assert is_volatile(f" SELECT {expression} AS x\n   FROM public.orders;")


def test_is_volatile_false_for_deterministic_query() -> None:
    assert not is_volatile(
        " SELECT orders.id,\n    orders.ts - '1 day'::interval AS t\n   FROM public.orders;"
    )


def test_numeric_quotients_follow_postgresql_scales() -> None:
    """Every numeric quotient and avg is PostgreSQL's (the row function), typed from the operands'
    shapes: numeric(10,2) has 8 integer digits and scale 2, an integer 10 digits and scale 0."""
    sql = squash(
        translated(
            " SELECT avg(amount) AS a, avg(qty) FILTER (WHERE flag) AS b, round(amount / qty, 2) AS c,"
            " (amount / qty) / 3 AS d, amount / price AS e, avg(amount) OVER (PARTITION BY customer) AS w"
            " FROM public.orders;",
            COLUMN_TYPES,
        )
    )
    # avg: sum / count, the average's integer digits are the argument's
    assert (
        "CAST(PGT_NUMERIC_DIV(SUM(amount), COUNT(amount), 2, 0, 30, 8, 'AVG(amount)') AS DECIMAL(38, 30)) AS a"
        in sql
    )
    assert "PGT_NUMERIC_DIV(SUM(qty) FILTER(WHERE flag), COUNT(qty) FILTER(WHERE flag), 0, 0, 28, 10," in sql
    assert (
        "PGT_NUMERIC_DIV(SUM(amount) OVER (PARTITION BY customer), COUNT(amount) OVER (PARTITION BY customer),"
        in sql
    )
    # round(q, 2) rounds the exact quotient (Spark's ROUND of a decimal is half away from zero too)
    assert (
        "ROUND(CAST(PGT_NUMERIC_DIV(amount, qty, 2, 0, 30, 8, 'amount / qty') AS DECIMAL(38, 30)), 2) AS c"
        in sql
    )
    # a quotient of a quotient gets the inner one's scale per row
    assert "PGT_NUMERIC_DIV_SCALE(amount, qty, 2, 0), 0, 30, 8, '(amount / qty) / 3')" in sql
    # an unconstrained numeric's display scale is not known: -1, decided per row
    assert "PGT_NUMERIC_DIV(amount, price, 2, -1, 20, 18," in sql
