"""The columns of a relation as PostgreSQL's catalog has them: the one ``pg_attribute`` type query."""

from __future__ import annotations

from typing import Any

import psycopg


def column_types(conn: psycopg.Connection[Any], relation: int | str) -> dict[str, str]:
    """Column name -> type as ``format_type`` spells it (``numeric(12,2)``, ``character varying(20)``).

    ``relation`` is an OID or a name as ``regclass`` reads it
    (``'pg_temp.__pgt_probe'``). The columns are in their table order;
    dropped and system columns are left out. A relation that does not exist
    raises PostgreSQL's error (``UndefinedTable`` for a name).
    """
    rows = conn.execute(
        "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute"
        " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (str(relation),),
    ).fetchall()
    return {str(name): str(type_name) for name, type_name in rows}
