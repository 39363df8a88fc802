"""A TPC-H-like dataset generated inside PostgreSQL, and the 22 queries in PostgreSQL syntax.

Written here from the TPC-H specification's schema and value rules (no dbgen code): the eight tables
with their columns and types, cardinalities per scale factor (SF), and the value domains the queries
depend on — region and nation names, part types / containers / brands / sizes, market segments,
order priorities, ship modes and instructions, date ranges (orders 1992-01-01 … 1998-08-02, ship
1–121 days after the order, commit 30–90 days, receipt 1–30 days after shipping, return flag and line
status from the 1995-06-17 "current date"), the partsupp supplier formula (so every lineitem's
(partkey, suppkey) is in partsupp), retail prices from the part key, extended price = quantity × retail
price, order total and status from the order's lines, phone country codes = nation + 10, and comments
made of words so that the queries' LIKE patterns ('%special%requests%', '%Customer%Complaints%',
'%green%', 'forest%') select small fractions as in TPC-H. Differences from dbgen: values come from
PostgreSQL's random() (seeded), order keys are dense (dbgen leaves gaps), texts are shorter, and
only 2 of 3 customers get orders as in the spec but by ``custkey % 3 <> 0`` chosen uniformly.

Query substitution parameters are the specification's validation values. ``ORDER BY`` is kept only
where the query has a row limit (a stream table is a table: order without a limit means nothing).
Q15's view is a ``WITH`` query.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg

NATIONS = [
    (0, "ALGERIA", 0),
    (1, "ARGENTINA", 1),
    (2, "BRAZIL", 1),
    (3, "CANADA", 1),
    (4, "EGYPT", 4),
    (5, "ETHIOPIA", 0),
    (6, "FRANCE", 3),
    (7, "GERMANY", 3),
    (8, "INDIA", 2),
    (9, "INDONESIA", 2),
    (10, "IRAN", 4),
    (11, "IRAQ", 4),
    (12, "JAPAN", 2),
    (13, "JORDAN", 4),
    (14, "KENYA", 0),
    (15, "MOROCCO", 0),
    (16, "MOZAMBIQUE", 0),
    (17, "PERU", 1),
    (18, "CHINA", 2),
    (19, "ROMANIA", 3),
    (20, "SAUDI ARABIA", 4),
    (21, "VIETNAM", 2),
    (22, "RUSSIA", 3),
    (23, "UNITED KINGDOM", 3),
    (24, "UNITED STATES", 1),
]
REGIONS = ["AFRICA", "AMERICA", "ASIA", "EUROPE", "MIDDLE EAST"]
COLORS = [
    "almond",
    "antique",
    "aquamarine",
    "azure",
    "beige",
    "bisque",
    "black",
    "blanched",
    "blue",
    "blush",
    "brown",
    "burlywood",
    "burnished",
    "chartreuse",
    "chiffon",
    "chocolate",
    "coral",
    "cornflower",
    "cornsilk",
    "cream",
    "cyan",
    "dark",
    "deep",
    "dim",
    "dodger",
    "drab",
    "firebrick",
    "floral",
    "forest",
    "frosted",
    "gainsboro",
    "ghost",
    "goldenrod",
    "green",
    "grey",
    "honeydew",
    "hot",
    "indian",
    "ivory",
    "khaki",
    "lace",
    "lavender",
    "lawn",
    "lemon",
    "light",
    "lime",
    "linen",
    "magenta",
    "maroon",
    "medium",
    "metallic",
    "midnight",
    "mint",
    "misty",
    "moccasin",
    "navajo",
    "navy",
    "olive",
    "orange",
    "orchid",
    "pale",
    "papaya",
    "peach",
    "peru",
    "pink",
    "plum",
    "powder",
    "puff",
    "purple",
    "red",
    "rose",
    "rosy",
    "royal",
    "saddle",
    "salmon",
    "sandy",
    "seashell",
    "sienna",
    "sky",
    "slate",
    "smoke",
    "snow",
    "spring",
    "steel",
    "tan",
    "thistle",
    "tomato",
    "turquoise",
    "violet",
    "wheat",
    "white",
    "yellow",
]
WORDS = [
    "furiously",
    "quickly",
    "carefully",
    "blithely",
    "slyly",
    "fluffily",
    "regular",
    "final",
    "ironic",
    "pending",
    "express",
    "bold",
    "even",
    "silent",
    "unusual",
    "special",
    "requests",
    "deposits",
    "accounts",
    "packages",
    "theodolites",
    "foxes",
    "pinto",
    "beans",
    "instructions",
    "dependencies",
    "excuses",
    "platelets",
    "asymptotes",
    "courts",
    "dolphins",
    "ideas",
    "sleep",
    "wake",
    "nag",
    "haggle",
    "cajole",
    "boost",
    "detect",
    "integrate",
    "use",
    "among",
    "about",
    "above",
    "across",
    "after",
]
TYPE_1 = ["STANDARD", "SMALL", "MEDIUM", "LARGE", "ECONOMY", "PROMO"]
TYPE_2 = ["ANODIZED", "BURNISHED", "PLATED", "POLISHED", "BRUSHED"]
TYPE_3 = ["TIN", "NICKEL", "BRASS", "STEEL", "COPPER"]
CONTAINER_1 = ["SM", "LG", "MED", "JUMBO", "WRAP"]
CONTAINER_2 = ["CASE", "BOX", "BAG", "JAR", "PKG", "PACK", "CAN", "DRUM"]
SEGMENTS = ["AUTOMOBILE", "BUILDING", "FURNITURE", "MACHINERY", "HOUSEHOLD"]
PRIORITIES = ["1-URGENT", "2-HIGH", "3-MEDIUM", "4-NOT SPECIFIED", "5-LOW"]
SHIP_MODES = ["REG AIR", "AIR", "RAIL", "SHIP", "TRUCK", "MAIL", "FOB"]
INSTRUCTIONS = ["DELIVER IN PERSON", "COLLECT COD", "NONE", "TAKE BACK RETURN"]

TABLES = ["region", "nation", "supplier", "part", "partsupp", "customer", "orders", "lineitem"]

SCHEMA = """
CREATE TABLE region (r_regionkey int PRIMARY KEY, r_name char(25) NOT NULL, r_comment varchar(152));
CREATE TABLE nation (n_nationkey int PRIMARY KEY, n_name char(25) NOT NULL, n_regionkey int NOT NULL,
                     n_comment varchar(152));
CREATE TABLE supplier (s_suppkey int PRIMARY KEY, s_name char(25) NOT NULL, s_address varchar(40) NOT NULL,
                       s_nationkey int NOT NULL, s_phone char(15) NOT NULL, s_acctbal numeric(15,2) NOT NULL,
                       s_comment varchar(101) NOT NULL);
CREATE TABLE part (p_partkey int PRIMARY KEY, p_name varchar(55) NOT NULL, p_mfgr char(25) NOT NULL,
                   p_brand char(10) NOT NULL, p_type varchar(25) NOT NULL, p_size int NOT NULL,
                   p_container char(10) NOT NULL, p_retailprice numeric(15,2) NOT NULL,
                   p_comment varchar(23) NOT NULL);
CREATE TABLE partsupp (ps_partkey int NOT NULL, ps_suppkey int NOT NULL, ps_availqty int NOT NULL,
                       ps_supplycost numeric(15,2) NOT NULL, ps_comment varchar(199) NOT NULL,
                       PRIMARY KEY (ps_partkey, ps_suppkey));
CREATE TABLE customer (c_custkey int PRIMARY KEY, c_name varchar(25) NOT NULL, c_address varchar(40) NOT NULL,
                       c_nationkey int NOT NULL, c_phone char(15) NOT NULL, c_acctbal numeric(15,2) NOT NULL,
                       c_mktsegment char(10) NOT NULL, c_comment varchar(117) NOT NULL);
CREATE TABLE orders (o_orderkey bigint PRIMARY KEY, o_custkey int NOT NULL, o_orderstatus char(1) NOT NULL,
                     o_totalprice numeric(15,2) NOT NULL, o_orderdate date NOT NULL,
                     o_orderpriority char(15) NOT NULL, o_clerk char(15) NOT NULL, o_shippriority int NOT NULL,
                     o_comment varchar(79) NOT NULL);
CREATE TABLE lineitem (l_orderkey bigint NOT NULL, l_partkey int NOT NULL, l_suppkey int NOT NULL,
                       l_linenumber int NOT NULL, l_quantity numeric(15,2) NOT NULL,
                       l_extendedprice numeric(15,2) NOT NULL, l_discount numeric(15,2) NOT NULL,
                       l_tax numeric(15,2) NOT NULL, l_returnflag char(1) NOT NULL, l_linestatus char(1) NOT NULL,
                       l_shipdate date NOT NULL, l_commitdate date NOT NULL, l_receiptdate date NOT NULL,
                       l_shipinstruct char(25) NOT NULL, l_shipmode char(10) NOT NULL,
                       l_comment varchar(44) NOT NULL, PRIMARY KEY (l_orderkey, l_linenumber));
"""


def schema(char_columns: bool) -> str:
    """The DDL: with the specification's ``char(n)`` columns, or ``varchar(n)`` in their place.

    pgtrickle refuses DIFFERENTIAL for a query comparing a ``char(n)`` column with a literal (PostgreSQL
    casts the literal to ``bpchar``, whose blank-padding semantics Spark does not share), so the
    benchmark runs on ``varchar`` by default and reports the refusals of the ``char(n)`` schema apart.
    """
    return SCHEMA if char_columns else SCHEMA.replace(" char(", " varchar(")


def _arr(values: list[str]) -> str:
    return "ARRAY[" + ", ".join("'" + v.replace("'", "''") + "'" for v in values) + "]"


def _pick(values: list[str]) -> str:
    """SQL: one of ``values``, uniformly."""
    return f"({_arr(values)})[1 + floor(random() * {len(values)})::int]"


def _words(n: int) -> str:
    """SQL: ``n`` random words separated by spaces."""
    return " || ' ' || ".join(_pick(WORDS) for _ in range(n))


def counts(sf: float) -> dict[str, int]:
    return {
        "supplier": max(10, round(10_000 * sf)),
        "part": max(200, round(200_000 * sf)),
        "customer": max(150, round(150_000 * sf)),
        "orders": max(1500, round(1_500_000 * sf)),
        "clerks": max(1, round(1000 * sf)),
    }


def _orders_sql(c: dict[str, int]) -> str:
    """INSERT the orders with keys %(lo)s..%(hi)s (totals and status filled from the lines afterwards)."""
    return f"""
INSERT INTO orders
SELECT k,
       -- only customers whose key is not a multiple of 3 place orders (as in the specification)
       -- 3·u + 1 or 3·u + 2: never a multiple of 3, uniform over the others
       least({c["customer"] - 1}, 3 * floor(random() * ({c["customer"]} / 3.0))::int + 1 + floor(random() * 2)::int),
       'O', 0,
       date '1992-01-01' + floor(random() * (date '1998-08-02' - 151 - date '1992-01-01' + 1))::int,
       {_pick(PRIORITIES)},
       'Clerk#' || lpad((1 + floor(random() * {c["clerks"]}))::int::text, 9, '0'),
       0,
       {_words(4)}
  FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) k
"""


def _lines_sql(c: dict[str, int]) -> str:
    """INSERT 1–7 lines for each order with key %(lo)s..%(hi)s."""
    s = c["supplier"]
    return f"""
INSERT INTO lineitem
SELECT o_orderkey, partkey,
       mod(partkey + i * ({s} / 4 + (partkey - 1) / {s}), {s}) + 1 AS suppkey,
       ln, qty,
       qty * ((90000 + mod(partkey / 10, 20001) + 100 * mod(partkey, 1000)) / 100.0)::numeric(15,2),
       disc, tax,
       CASE WHEN receipt <= date '1995-06-17' THEN (CASE WHEN random() < 0.5 THEN 'R' ELSE 'A' END) ELSE 'N' END,
       CASE WHEN ship > date '1995-06-17' THEN 'O' ELSE 'F' END,
       ship, commit_, receipt, instr, mode, comment_
  FROM (
    SELECT o.o_orderkey, ln,
           1 + floor(random() * {c["part"]})::int AS partkey,
           floor(random() * 4)::int AS i,
           (1 + floor(random() * 50))::numeric(15,2) AS qty,
           (floor(random() * 11) / 100.0)::numeric(15,2) AS disc,
           (floor(random() * 9) / 100.0)::numeric(15,2) AS tax,
           o.o_orderdate + 1 + floor(random() * 121)::int AS ship,
           o.o_orderdate + 30 + floor(random() * 61)::int AS commit_,
           floor(random() * 30)::int + 1 AS receipt_gap,
           {_pick(INSTRUCTIONS)} AS instr, {_pick(SHIP_MODES)} AS mode, {_words(3)} AS comment_
      FROM orders o, generate_series(1, 1 + floor(random() * 7)::int + 0 * o.o_orderkey::int) ln
     WHERE o.o_orderkey BETWEEN %(lo)s AND %(hi)s
  ) g, LATERAL (SELECT ship + receipt_gap AS receipt) r
"""


FIX_ORDERS = """
UPDATE orders o SET o_totalprice = t.total, o_orderstatus = t.status
  FROM (SELECT l_orderkey,
               round(sum(l_extendedprice * (1 + l_tax) * (1 - l_discount)), 2) AS total,
               CASE WHEN bool_and(l_linestatus = 'F') THEN 'F' WHEN bool_and(l_linestatus = 'O') THEN 'O'
                    ELSE 'P' END AS status
          FROM lineitem WHERE l_orderkey BETWEEN %(lo)s AND %(hi)s GROUP BY l_orderkey) t
 WHERE o.o_orderkey = t.l_orderkey
"""


def _insert_orders(conn: psycopg.Connection, c: dict[str, int], lo: int, hi: int) -> None:
    """Orders lo..hi with their lines, totals and status (the spec's RF1 shape)."""
    orders = _orders_sql(c)
    params = {"lo": lo, "hi": hi}
    conn.execute(orders, params)
    conn.execute(_lines_sql(c), params)
    conn.execute(FIX_ORDERS, params)


def load(
    conn: psycopg.Connection,
    sf: float,
    progress: Callable[[str], None] = print,
    chunk_orders: int = 250_000,
    char_columns: bool = False,
) -> dict[str, float]:
    """Create and fill the eight tables at scale factor ``sf`` in ``conn``'s database; returns seconds per step."""
    c = counts(sf)
    seconds: dict[str, float] = {}
    started = time.monotonic()
    conn.execute("SELECT setseed(0.1992)")
    for statement in schema(char_columns).split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute(
        "INSERT INTO region SELECT i - 1, r, " + _words(5) + f" FROM unnest({_arr(REGIONS)}) WITH "
        "ORDINALITY AS t(r, i)"
    )
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO nation VALUES (%s, %s, %s, " + _words(6) + ")", NATIONS)
    conn.execute(f"""
INSERT INTO supplier
SELECT k, 'Supplier#' || lpad(k::text, 9, '0'), {_words(2)}, n,
       (n + 10)::text || '-' || (100 + floor(random() * 900))::int || '-' || (100 + floor(random() * 900))::int
         || '-' || (1000 + floor(random() * 9000))::int,
       round((-999.99 + random() * 10999.98)::numeric, 2),
       CASE WHEN random() < 0.0005 THEN {_words(1)} || ' Customer ' || {_words(1)} || ' Complaints'
            WHEN random() < 0.0005 THEN {_words(1)} || ' Customer ' || {_words(1)} || ' Recommends'
            ELSE {_words(5)} END
  FROM generate_series(1, {c["supplier"]}) k, LATERAL (SELECT floor(random() * 25)::int + 0 * k AS n) x
""")
    conn.execute(f"""
INSERT INTO part
SELECT k, name, 'Manufacturer#' || m, 'Brand#' || m || (1 + floor(random() * 5))::int,
       {_pick(TYPE_1)} || ' ' || {_pick(TYPE_2)} || ' ' || {_pick(TYPE_3)},
       1 + floor(random() * 50)::int,
       {_pick(CONTAINER_1)} || ' ' || {_pick(CONTAINER_2)},
       ((90000 + ((k / 10) % 20001) + 100 * (k % 1000)) / 100.0)::numeric(15,2),
       left({_words(2)}, 23)
  FROM generate_series(1, {c["part"]}) k,
       LATERAL (SELECT {" || ' ' || ".join(_pick(COLORS) for _ in range(5))} || left(k::text, 0) AS name,
                       1 + floor(random() * 5)::int + 0 * k AS m) x
""")
    s = c["supplier"]
    conn.execute(f"""
INSERT INTO partsupp
SELECT p, ((p + (i * ({s} / 4 + (p - 1) / {s}))) % {s}) + 1, 1 + floor(random() * 9999)::int,
       round((1 + random() * 999)::numeric, 2), {_words(8)}
  FROM generate_series(1, {c["part"]}) p, generate_series(0, 3) i
ON CONFLICT DO NOTHING
""")
    conn.execute(f"""
INSERT INTO customer
SELECT k, 'Customer#' || lpad(k::text, 9, '0'), {_words(2)}, n,
       (n + 10)::text || '-' || (100 + floor(random() * 900))::int || '-' || (100 + floor(random() * 900))::int
         || '-' || (1000 + floor(random() * 9000))::int,
       round((-999.99 + random() * 10999.98)::numeric, 2), {_pick(SEGMENTS)}, {_words(6)}
  FROM generate_series(1, {c["customer"]}) k, LATERAL (SELECT floor(random() * 25)::int + 0 * k AS n) x
""")
    seconds["dimensions"] = time.monotonic() - started
    started = time.monotonic()
    total = c["orders"]
    for lo in range(1, total + 1, chunk_orders):
        hi = min(total, lo + chunk_orders - 1)
        _insert_orders(conn, c, lo, hi)
        progress(f"    orders {hi:,} / {total:,} (with their lines) after {time.monotonic() - started:.0f}s")
    seconds["orders_lineitem"] = time.monotonic() - started
    started = time.monotonic()
    conn.execute("CREATE INDEX lineitem_partkey ON lineitem (l_partkey)")
    conn.execute("CREATE INDEX lineitem_suppkey ON lineitem (l_suppkey)")
    conn.execute("CREATE INDEX orders_custkey ON orders (o_custkey)")
    conn.execute("CREATE INDEX partsupp_suppkey ON partsupp (ps_suppkey)")
    for table in TABLES:
        conn.execute(f"VACUUM ANALYZE {table}")
    seconds["index_analyze"] = time.monotonic() - started
    return {k: round(v, 2) for k, v in seconds.items()}


def apply_changes(conn: psycopg.Connection, sf: float, new_orders: int, seed: float) -> dict[str, int]:
    """One transaction of sustained random changes, in proportion to ``new_orders``.

    ``new_orders`` new orders with their 1–7 lines (RF1), as many of the oldest-key live orders deleted
    with their lines (RF2, so the data size stays level), and updates: ``new_orders`` random lines get a
    new quantity / discount (extended price follows), ``new_orders // 2`` random orders a new priority,
    and a few customers, part-suppliers and suppliers a new balance / quantity / cost.
    """
    c = counts(sf)
    with conn.transaction():
        conn.execute("SELECT setseed(%s)", (seed,))
        top = int(conn.execute("SELECT coalesce(max(o_orderkey), 0) FROM orders").fetchone()[0])  # type: ignore[index]
        _insert_orders(conn, c, top + 1, top + new_orders)
        doomed = [
            r[0]
            for r in conn.execute(
                "SELECT o_orderkey FROM orders ORDER BY random() LIMIT %s", (new_orders,)
            ).fetchall()
        ]
        conn.execute("DELETE FROM lineitem WHERE l_orderkey = ANY(%s)", (doomed,))
        conn.execute("DELETE FROM orders WHERE o_orderkey = ANY(%s)", (doomed,))
        lines = conn.execute(
            """
            UPDATE lineitem l SET l_quantity = q.qty, l_discount = q.disc,
                   l_extendedprice = q.qty * ((90000 + ((l.l_partkey / 10) %% 20001)
                                               + 100 * (l.l_partkey %% 1000)) / 100.0)::numeric(15,2)
              FROM (SELECT l_orderkey, l_linenumber, (1 + floor(random() * 50))::numeric(15,2) AS qty,
                           (floor(random() * 11) / 100.0)::numeric(15,2) AS disc
                      FROM lineitem TABLESAMPLE BERNOULLI (%s) LIMIT %s) q
             WHERE l.l_orderkey = q.l_orderkey AND l.l_linenumber = q.l_linenumber
            """,
            (min(100.0, 300.0 * new_orders / max(1, c["orders"] * 4)), new_orders),
        ).rowcount
        orders = conn.execute(
            f"UPDATE orders SET o_orderpriority = {_pick(PRIORITIES)} WHERE o_orderkey IN"
            " (SELECT o_orderkey FROM orders TABLESAMPLE BERNOULLI (%s) LIMIT %s)",
            (min(100.0, 300.0 * new_orders / max(1, c["orders"])), max(1, new_orders // 2)),
        ).rowcount
        few = max(1, new_orders // 20)
        customers = conn.execute(
            "UPDATE customer SET c_acctbal = round((-999.99 + random() * 10999.98)::numeric, 2)"
            " WHERE c_custkey IN (SELECT 1 + floor(random() * %s)::int FROM generate_series(1, %s))",
            (c["customer"], few),
        ).rowcount
        partsupps = conn.execute(
            "UPDATE partsupp SET ps_availqty = 1 + floor(random() * 9999)::int,"
            " ps_supplycost = round((1 + random() * 999)::numeric, 2)"
            " WHERE ps_partkey IN (SELECT 1 + floor(random() * %s)::int FROM generate_series(1, %s))",
            (c["part"], few),
        ).rowcount
        suppliers = conn.execute(
            "UPDATE supplier SET s_acctbal = round((-999.99 + random() * 10999.98)::numeric, 2)"
            " WHERE s_suppkey IN (SELECT 1 + floor(random() * %s)::int FROM generate_series(1, %s))",
            (c["supplier"], max(1, few // 5)),
        ).rowcount
    return {
        "orders_inserted": new_orders,
        "orders_deleted": len(doomed),
        "lineitems_updated": lines,
        "orders_updated": orders,
        "customers_updated": customers,
        "partsupps_updated": partsupps,
        "suppliers_updated": suppliers,
    }


def queries(sf: float) -> dict[str, str]:
    """The 22 TPC-H queries, PostgreSQL syntax, validation parameters."""
    fraction = 0.0001 / sf
    in_codes = "('13', '31', '23', '29', '30', '18', '17')"
    revenue = "l_extendedprice * (1 - l_discount)"
    return {
        "q01": f"""SELECT l_returnflag, l_linestatus, sum(l_quantity) AS sum_qty,
       sum(l_extendedprice) AS sum_base_price, sum({revenue}) AS sum_disc_price,
       sum({revenue} * (1 + l_tax)) AS sum_charge, avg(l_quantity) AS avg_qty,
       avg(l_extendedprice) AS avg_price, avg(l_discount) AS avg_disc, count(*) AS count_order
  FROM lineitem WHERE l_shipdate <= date '1998-12-01' - interval '90 days'
 GROUP BY l_returnflag, l_linestatus""",
        "q02": """SELECT s_acctbal, s_name, n_name, p_partkey, p_mfgr, s_address, s_phone, s_comment
  FROM part, supplier, partsupp, nation, region
 WHERE p_partkey = ps_partkey AND s_suppkey = ps_suppkey AND p_size = 15 AND p_type LIKE '%BRASS'
   AND s_nationkey = n_nationkey AND n_regionkey = r_regionkey AND r_name = 'EUROPE'
   AND ps_supplycost = (SELECT min(ps_supplycost) FROM partsupp, supplier, nation, region
                         WHERE p_partkey = ps_partkey AND s_suppkey = ps_suppkey AND s_nationkey = n_nationkey
                           AND n_regionkey = r_regionkey AND r_name = 'EUROPE')
 ORDER BY s_acctbal DESC, n_name, s_name, p_partkey LIMIT 100""",
        "q03": f"""SELECT l_orderkey, sum({revenue}) AS revenue, o_orderdate, o_shippriority
  FROM customer, orders, lineitem
 WHERE c_mktsegment = 'BUILDING' AND c_custkey = o_custkey AND l_orderkey = o_orderkey
   AND o_orderdate < date '1995-03-15' AND l_shipdate > date '1995-03-15'
 GROUP BY l_orderkey, o_orderdate, o_shippriority
 ORDER BY revenue DESC, o_orderdate, l_orderkey LIMIT 10""",
        "q04": """SELECT o_orderpriority, count(*) AS order_count FROM orders
 WHERE o_orderdate >= date '1993-07-01' AND o_orderdate < date '1993-07-01' + interval '3 months'
   AND EXISTS (SELECT * FROM lineitem WHERE l_orderkey = o_orderkey AND l_commitdate < l_receiptdate)
 GROUP BY o_orderpriority""",
        "q05": f"""SELECT n_name, sum({revenue}) AS revenue
  FROM customer, orders, lineitem, supplier, nation, region
 WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey AND l_suppkey = s_suppkey
   AND c_nationkey = s_nationkey AND s_nationkey = n_nationkey AND n_regionkey = r_regionkey
   AND r_name = 'ASIA' AND o_orderdate >= date '1994-01-01' AND o_orderdate < date '1994-01-01' + interval '1 year'
 GROUP BY n_name""",
        "q06": """SELECT sum(l_extendedprice * l_discount) AS revenue FROM lineitem
 WHERE l_shipdate >= date '1994-01-01' AND l_shipdate < date '1994-01-01' + interval '1 year'
   AND l_discount BETWEEN 0.06 - 0.01 AND 0.06 + 0.01 AND l_quantity < 24""",
        "q07": f"""SELECT supp_nation, cust_nation, l_year, sum(volume) AS revenue FROM (
  SELECT n1.n_name AS supp_nation, n2.n_name AS cust_nation, extract(year FROM l_shipdate) AS l_year,
         {revenue} AS volume
    FROM supplier, lineitem, orders, customer, nation n1, nation n2
   WHERE s_suppkey = l_suppkey AND o_orderkey = l_orderkey AND c_custkey = o_custkey
     AND s_nationkey = n1.n_nationkey AND c_nationkey = n2.n_nationkey
     AND ((n1.n_name = 'FRANCE' AND n2.n_name = 'GERMANY') OR (n1.n_name = 'GERMANY' AND n2.n_name = 'FRANCE'))
     AND l_shipdate BETWEEN date '1995-01-01' AND date '1996-12-31') AS shipping
 GROUP BY supp_nation, cust_nation, l_year""",
        "q08": f"""SELECT o_year, sum(CASE WHEN nation = 'BRAZIL' THEN volume ELSE 0 END) / sum(volume) AS mkt_share
  FROM (SELECT extract(year FROM o_orderdate) AS o_year, {revenue} AS volume, n2.n_name AS nation
          FROM part, supplier, lineitem, orders, customer, nation n1, nation n2, region
         WHERE p_partkey = l_partkey AND s_suppkey = l_suppkey AND l_orderkey = o_orderkey
           AND o_custkey = c_custkey AND c_nationkey = n1.n_nationkey AND n1.n_regionkey = r_regionkey
           AND r_name = 'AMERICA' AND s_nationkey = n2.n_nationkey
           AND o_orderdate BETWEEN date '1995-01-01' AND date '1996-12-31'
           AND p_type = 'ECONOMY ANODIZED STEEL') AS all_nations
 GROUP BY o_year""",
        "q09": f"""SELECT nation, o_year, sum(amount) AS sum_profit FROM (
  SELECT n_name AS nation, extract(year FROM o_orderdate) AS o_year,
         {revenue} - ps_supplycost * l_quantity AS amount
    FROM part, supplier, lineitem, partsupp, orders, nation
   WHERE s_suppkey = l_suppkey AND ps_suppkey = l_suppkey AND ps_partkey = l_partkey AND p_partkey = l_partkey
     AND o_orderkey = l_orderkey AND s_nationkey = n_nationkey AND p_name LIKE '%green%') AS profit
 GROUP BY nation, o_year""",
        "q10": f"""SELECT c_custkey, c_name, sum({revenue}) AS revenue, c_acctbal, n_name, c_address, c_phone, c_comment
  FROM customer, orders, lineitem, nation
 WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey AND o_orderdate >= date '1993-10-01'
   AND o_orderdate < date '1993-10-01' + interval '3 months' AND l_returnflag = 'R' AND c_nationkey = n_nationkey
 GROUP BY c_custkey, c_name, c_acctbal, c_phone, n_name, c_address, c_comment
 ORDER BY revenue DESC, c_custkey LIMIT 20""",
        "q11": f"""SELECT ps_partkey, sum(ps_supplycost * ps_availqty) AS value
  FROM partsupp, supplier, nation
 WHERE ps_suppkey = s_suppkey AND s_nationkey = n_nationkey AND n_name = 'GERMANY'
 GROUP BY ps_partkey
HAVING sum(ps_supplycost * ps_availqty) > (
       SELECT sum(ps_supplycost * ps_availqty) * {fraction:.10f} FROM partsupp, supplier, nation
        WHERE ps_suppkey = s_suppkey AND s_nationkey = n_nationkey AND n_name = 'GERMANY')""",
        "q12": """SELECT l_shipmode,
       sum(CASE WHEN o_orderpriority = '1-URGENT' OR o_orderpriority = '2-HIGH' THEN 1 ELSE 0 END) AS high_line_count,
       sum(CASE WHEN o_orderpriority <> '1-URGENT' AND o_orderpriority <> '2-HIGH' THEN 1 ELSE 0 END) AS low_line_count
  FROM orders, lineitem
 WHERE o_orderkey = l_orderkey AND l_shipmode IN ('MAIL', 'SHIP') AND l_commitdate < l_receiptdate
   AND l_shipdate < l_commitdate AND l_receiptdate >= date '1994-01-01'
   AND l_receiptdate < date '1994-01-01' + interval '1 year'
 GROUP BY l_shipmode""",
        "q13": """SELECT c_count, count(*) AS custdist FROM (
  SELECT c_custkey, count(o_orderkey) AS c_count
    FROM customer LEFT OUTER JOIN orders ON c_custkey = o_custkey AND o_comment NOT LIKE '%special%requests%'
   GROUP BY c_custkey) AS c_orders
 GROUP BY c_count""",
        "q14": f"""SELECT 100.00 * sum(CASE WHEN p_type LIKE 'PROMO%' THEN {revenue} ELSE 0 END)
       / sum({revenue}) AS promo_revenue
  FROM lineitem, part
 WHERE l_partkey = p_partkey AND l_shipdate >= date '1995-09-01'
   AND l_shipdate < date '1995-09-01' + interval '1 month'""",
        "q15": f"""WITH revenue0 AS (
  SELECT l_suppkey AS supplier_no, sum({revenue}) AS total_revenue FROM lineitem
   WHERE l_shipdate >= date '1996-01-01' AND l_shipdate < date '1996-01-01' + interval '3 months'
   GROUP BY l_suppkey)
SELECT s_suppkey, s_name, s_address, s_phone, total_revenue FROM supplier, revenue0
 WHERE s_suppkey = supplier_no AND total_revenue = (SELECT max(total_revenue) FROM revenue0)""",
        "q16": """SELECT p_brand, p_type, p_size, count(DISTINCT ps_suppkey) AS supplier_cnt
  FROM partsupp, part
 WHERE p_partkey = ps_partkey AND p_brand <> 'Brand#45' AND p_type NOT LIKE 'MEDIUM POLISHED%'
   AND p_size IN (49, 14, 23, 45, 19, 3, 36, 9)
   AND ps_suppkey NOT IN (SELECT s_suppkey FROM supplier WHERE s_comment LIKE '%Customer%Complaints%')
 GROUP BY p_brand, p_type, p_size""",
        "q17": """SELECT sum(l_extendedprice) / 7.0 AS avg_yearly FROM lineitem, part
 WHERE p_partkey = l_partkey AND p_brand = 'Brand#23' AND p_container = 'MED BOX'
   AND l_quantity < (SELECT 0.2 * avg(l_quantity) FROM lineitem WHERE l_partkey = p_partkey)""",
        "q18": """SELECT c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice, sum(l_quantity) AS sum_qty
  FROM customer, orders, lineitem
 WHERE o_orderkey IN (SELECT l_orderkey FROM lineitem GROUP BY l_orderkey HAVING sum(l_quantity) > 300)
   AND c_custkey = o_custkey AND o_orderkey = l_orderkey
 GROUP BY c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice
 ORDER BY o_totalprice DESC, o_orderdate, o_orderkey LIMIT 100""",
        "q19": f"""SELECT sum({revenue}) AS revenue FROM lineitem, part
 WHERE (p_partkey = l_partkey AND p_brand = 'Brand#12' AND p_container IN ('SM CASE', 'SM BOX', 'SM PACK', 'SM PKG')
        AND l_quantity >= 1 AND l_quantity <= 1 + 10 AND p_size BETWEEN 1 AND 5
        AND l_shipmode IN ('AIR', 'REG AIR') AND l_shipinstruct = 'DELIVER IN PERSON')
    OR (p_partkey = l_partkey AND p_brand = 'Brand#23' AND p_container IN ('MED BAG', 'MED BOX', 'MED PKG', 'MED PACK')
        AND l_quantity >= 10 AND l_quantity <= 10 + 10 AND p_size BETWEEN 1 AND 10
        AND l_shipmode IN ('AIR', 'REG AIR') AND l_shipinstruct = 'DELIVER IN PERSON')
    OR (p_partkey = l_partkey AND p_brand = 'Brand#34' AND p_container IN ('LG CASE', 'LG BOX', 'LG PACK', 'LG PKG')
        AND l_quantity >= 20 AND l_quantity <= 20 + 10 AND p_size BETWEEN 1 AND 15
        AND l_shipmode IN ('AIR', 'REG AIR') AND l_shipinstruct = 'DELIVER IN PERSON')""",
        "q20": """SELECT s_name, s_address FROM supplier, nation
 WHERE s_suppkey IN (
         SELECT ps_suppkey FROM partsupp
          WHERE ps_partkey IN (SELECT p_partkey FROM part WHERE p_name LIKE 'forest%')
            AND ps_availqty > (SELECT 0.5 * sum(l_quantity) FROM lineitem
                                WHERE l_partkey = ps_partkey AND l_suppkey = ps_suppkey
                                  AND l_shipdate >= date '1994-01-01'
                                  AND l_shipdate < date '1994-01-01' + interval '1 year'))
   AND s_nationkey = n_nationkey AND n_name = 'CANADA'""",
        "q21": """SELECT s_name, count(*) AS numwait FROM supplier, lineitem l1, orders, nation
 WHERE s_suppkey = l1.l_suppkey AND o_orderkey = l1.l_orderkey AND o_orderstatus = 'F'
   AND l1.l_receiptdate > l1.l_commitdate
   AND EXISTS (SELECT * FROM lineitem l2 WHERE l2.l_orderkey = l1.l_orderkey AND l2.l_suppkey <> l1.l_suppkey)
   AND NOT EXISTS (SELECT * FROM lineitem l3 WHERE l3.l_orderkey = l1.l_orderkey
                      AND l3.l_suppkey <> l1.l_suppkey AND l3.l_receiptdate > l3.l_commitdate)
   AND s_nationkey = n_nationkey AND n_name = 'SAUDI ARABIA'
 GROUP BY s_name ORDER BY numwait DESC, s_name LIMIT 100""",
        "q22": f"""SELECT cntrycode, count(*) AS numcust, sum(c_acctbal) AS totacctbal FROM (
  SELECT substring(c_phone FROM 1 FOR 2) AS cntrycode, c_acctbal FROM customer
   WHERE substring(c_phone FROM 1 FOR 2) IN {in_codes}
     AND c_acctbal > (SELECT avg(c_acctbal) FROM customer
                       WHERE c_acctbal > 0.00 AND substring(c_phone FROM 1 FOR 2) IN {in_codes})
     AND NOT EXISTS (SELECT * FROM orders WHERE o_custkey = c_custkey)) AS custsale
 GROUP BY cntrycode""",
    }
