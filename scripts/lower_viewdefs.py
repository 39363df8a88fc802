"""Regenerate ``tests/unit/lower_viewdefs.json``: the defining queries the lowering tests read.

:func:`pgtrickle.dvm.lower.lower` reads PostgreSQL's normalized query text (``pg_get_viewdef(view,
true)`` with ``search_path = pg_catalog``), not what a user typed. The unit tests run without a
database, so this script asks a real (embedded) PostgreSQL once for that text of every test query —
the 22 TPC-H-derived queries of ``benchmarks/tpch_data.py``, the shapes of
``tests/integration/test_differential*.py`` and a few more — and stores it with the view's
output columns and each relation's columns, in order.

    PYTHONPATH=src .venv/bin/python scripts/lower_viewdefs.py
"""

from __future__ import annotations

import json
import shutil
import socket
import sys
import tempfile
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import tpch_data  # noqa: E402
from tests.integration.test_differential import QUERIES as DIFF_QUERIES  # noqa: E402
from tests.integration.test_differential_properties import SHAPES  # noqa: E402

from pgtrickle.db.embedded import EmbeddedPostgres  # noqa: E402

OUT = ROOT / "tests" / "unit" / "lower_viewdefs.json"

SCHEMAS = {
    "tpch": tpch_data.schema(char_columns=False),
    "diff": (
        "CREATE TABLE orders (id int PRIMARY KEY, cust int, region text, amount numeric(10,2), qty int);"
        "CREATE TABLE customers (id int PRIMARY KEY, name text, tier int);"
    ),
    "props": (
        "CREATE TABLE a (id int PRIMARY KEY, k int, g text, v numeric(8,2), n int, f float8);"
        "CREATE TABLE b (id int PRIMARY KEY, k int, name text, w int);"
        "CREATE TABLE c (id int PRIMARY KEY, a_id int, x int);"
        "CREATE TABLE base_a (i int, j int); CREATE TABLE base_b (i int, k int);"
    ),
}

EXTRA = {
    "issue17_nested_with": (
        "WITH b AS (SELECT * FROM base_b) SELECT v.i, v.j FROM "
        "(WITH a AS (SELECT * FROM base_a) SELECT a.i, a.j FROM a, b WHERE a.i = b.i) v"
    ),
    "cte_in_cte": (
        "WITH x AS (WITH y AS (SELECT id, k FROM a WHERE k > 0) SELECT y.id FROM y) SELECT x.id FROM x"
    ),
    "cte_shared": (
        "WITH t AS (SELECT k, count(*) AS n FROM a GROUP BY k) "
        "SELECT t1.k, t2.n FROM t t1 JOIN t t2 ON t1.k = t2.n"
    ),
    "star": "SELECT * FROM a",
    "star_join": "SELECT a.*, b.name FROM a JOIN b ON a.k = b.k",
    "join_using": "SELECT * FROM a JOIN b USING (id, k)",
    "join_natural": "SELECT * FROM b NATURAL JOIN c",
    "full_using": "SELECT k, a.id, b.id AS bid FROM a FULL JOIN b USING (k)",
    "left_nested": (
        "SELECT a.id, b.id AS bid, c.id AS cid FROM a LEFT JOIN (b JOIN c ON c.a_id = b.id) "
        "ON b.k = a.k AND a.n > 1"
    ),
    "right_nested": "SELECT a.id, c.x FROM a JOIN b ON a.k = b.k RIGHT JOIN c ON c.a_id = a.id",
    "distinct_on": "SELECT DISTINCT ON (k) k, id, v FROM a ORDER BY k, v DESC",
    "fromless": "SELECT 1 AS one, 'x'::text AS two",
    "group_expr_having": (
        "SELECT k % 2 AS parity, sum(v) * 2 AS s2 FROM a WHERE n > 0 "
        "GROUP BY k % 2 HAVING count(DISTINCT g) > 1"
    ),
    "order_no_limit": "SELECT id, k FROM a ORDER BY k",
    "exists_or": "SELECT id FROM a WHERE k = 1 OR EXISTS (SELECT 1 FROM b WHERE b.k = a.k)",
    "not_in_select_list": "SELECT id, k NOT IN (SELECT w FROM b) AS absent FROM a",
    "in_select_list": "SELECT id, k IN (SELECT w FROM b) AS present FROM a",
    "any_lt": "SELECT id FROM a WHERE k < ANY (SELECT w FROM b)",
    "all_gt": "SELECT id FROM a WHERE k > ALL (SELECT w FROM b WHERE b.id = a.id)",
    "scalar_correlated_two_keys": (
        "SELECT a.id, (SELECT sum(c.x) FROM c WHERE c.a_id = a.id AND c.x > a.n) AS sx FROM a"
    ),
    "scalar_correlated_expr_count": "SELECT id, (SELECT count(*) + 1 FROM b WHERE b.k = a.k) AS nb1 FROM a",
    "window_frame": (
        "SELECT id, sum(v) OVER (PARTITION BY k ORDER BY id ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)"
        " AS s FROM a"
    ),
    "agg_in_window": "SELECT k, sum(count(*)) OVER () AS total FROM a GROUP BY k",
    "union_all_in_union": "SELECT k FROM a UNION (SELECT k FROM b UNION ALL SELECT a_id FROM c)",
    "nested_derived": (
        "SELECT s.m FROM (SELECT t.k + 1 AS m FROM (SELECT k FROM a WHERE n > 0) t) s WHERE s.m > 2"
    ),
    "exists_uncorrelated": "SELECT id FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.w > 5)",
    "exists_in_derived": (
        "SELECT s.id FROM (SELECT a.id FROM a WHERE NOT EXISTS "
        "(SELECT 1 FROM c WHERE c.a_id = a.id AND c.x > a.n)) s"
    ),
    "limit_only": "SELECT id FROM a LIMIT 3",
    "topk_in_derived": "SELECT t.id FROM (SELECT id, v FROM a ORDER BY v DESC LIMIT 3) t WHERE t.id > 1",
    "same_names": "SELECT t.k FROM (SELECT a.k, b.k AS k2 FROM a JOIN b ON a.k = b.k) t",
    "group_by_all_of_join": (
        "SELECT b.name, a.g, count(*) AS n FROM a JOIN b ON a.k = b.k GROUP BY b.name, a.g"
    ),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="pgtrickle-viewdefs-", dir="/tmp"))
    root.chmod(0o755)
    server = EmbeddedPostgres(root, _free_port())
    server.start()
    cases: dict[str, dict[str, str]] = {}
    relations: dict[str, list[str]] = {}
    groups = {
        "tpch": tpch_data.queries(0.01),
        "diff": dict(DIFF_QUERIES),
        "props": {**SHAPES, **EXTRA},
    }
    try:
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            for schema, ddl in SCHEMAS.items():
                conn.execute(f"CREATE SCHEMA {schema}")
                conn.execute(f"SET search_path = {schema}")
                conn.execute(ddl)
                for name, query in groups[schema].items():
                    view = f"{schema}.v_{name}"
                    conn.execute(f"CREATE VIEW {view} AS {query}")
                    text = conn.execute(
                        "SELECT set_config('search_path', 'pg_catalog', true), "
                        "pg_get_viewdef(%s::regclass, true)",
                        (view,),
                    ).fetchone()[1]
                    conn.execute(f"SET search_path = {schema}")
                    columns = [
                        r[0]
                        for r in conn.execute(
                            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                            "ORDER BY attnum",
                            (view,),
                        ).fetchall()
                    ]
                    cases[f"{schema}.{name}"] = {"query": query, "viewdef": text, "columns": columns}
            rows = conn.execute(
                "SELECT n.nspname || '.' || c.relname, array_agg(a.attname ORDER BY a.attnum) "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
                "WHERE c.relkind = 'r' AND n.nspname IN ('tpch', 'diff', 'props') GROUP BY 1 ORDER BY 1"
            ).fetchall()
            relations = {name: list(cols) for name, cols in rows}
    finally:
        server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)
    OUT.write_text(json.dumps({"relations": relations, "cases": cases}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(cases)} cases to {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
