import time
import pytest
from pgtrickle.spark import jobs
from tests.integration.helpers import create_st, refresh_and_check

pytestmark = pytest.mark.integration

QUERIES = {
    "agg_join": "SELECT c.region, sum(o.amount) AS total, count(*) AS n FROM orders o JOIN customers c ON c.id = o.customer GROUP BY c.region",
    "left_join": "SELECT c.id, c.region, o.amount FROM customers c LEFT JOIN orders o ON o.customer = c.id",
    "filter": "SELECT id, amount FROM orders WHERE amount > 100",
}

@pytest.mark.usefixtures("spark")
def test_measure(db, spark) -> None:
    db.sql("CREATE TABLE customers (id int PRIMARY KEY, region text)")
    db.sql("CREATE TABLE orders (id int PRIMARY KEY, customer int, amount numeric(10,2))")
    db.sql("INSERT INTO customers SELECT g, 'r' || (g % 4) FROM generate_series(1, 40) g")
    db.sql("INSERT INTO orders SELECT g, 1 + g % 40, g * 1.5 FROM generate_series(1, 400) g")
    for name, q in QUERIES.items():
        create_st(db, name, q)
    refresh_and_check(db)
    db.sql("INSERT INTO orders VALUES (1001, 3, 10), (1002, 7, 20)")
    db.sql("UPDATE customers SET region = 'x' WHERE id = 5")
    refresh_and_check(db)
    for name in QUERIES:
        for row in db.sql("SELECT action, status, spark_jobs, spark_stages, spark_jobs_why FROM pgtrickle.get_refresh_history(%s, 5)", (name,)):
            print("MEASURE", name, row)
    with jobs.counting("m", "m"):
        from pgtrickle.spark.capabilities import tag_jobs
        tag_jobs(spark, "m", "m")
        spark.range(10).collect()
        t = time.perf_counter()
        for _ in range(20):
            f = jobs.figures()
        print("MEASURE figures() ms", (time.perf_counter() - t) / 20 * 1000, f)
