"""Parsing a defining query (PostgreSQL's normalised text) and finding the tables it reads.

Pure: text in, sqlglot tree out (see ``sql/translate.py`` for the input the
translation expects).
"""

from __future__ import annotations

from collections.abc import Mapping

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from pgtrickle.errors import UnsupportedQueryError
from pgtrickle.sql.nodes import READ


def parse_query(pg_sql: str) -> exp.Query:
    """Parse PostgreSQL query text into a sqlglot query expression.

    The text may end with semicolons.  It must contain exactly one
    ``SELECT`` or set-operation (``UNION``/``INTERSECT``/``EXCEPT``) query,
    optionally with a ``WITH`` clause.

    Raises:
        UnsupportedQueryError: the text cannot be parsed, holds several
            statements, or is not a query (for example an ``INSERT``).
    """
    text = pg_sql.strip()
    while text.endswith(";"):
        text = text[:-1].rstrip()
    if not text:
        raise UnsupportedQueryError("the defining query is empty")
    try:
        statements = [s for s in sqlglot.parse(_normalise_tokens(text), read=READ) if s is not None]
    except (ParseError, TokenError) as err:
        raise UnsupportedQueryError(
            f"the defining query could not be parsed as PostgreSQL SQL: {err}"
        ) from err
    if len(statements) != 1:
        raise UnsupportedQueryError(f"the defining query must be a single statement, found {len(statements)}")
    statement = statements[0]
    while isinstance(statement, exp.Subquery) and not statement.alias:
        statement = statement.this
    if not isinstance(statement, (exp.Select, exp.SetOperation)):
        raise UnsupportedQueryError(
            f"the defining query must be a SELECT query, found {_describe_statement(statement)}"
        )
    if isinstance(statement, exp.Select) and statement.args.get("into"):
        raise UnsupportedQueryError("the defining query must be a SELECT query, found SELECT ... INTO")
    return statement


def referenced_tables(pg_sql: str) -> list[tuple[str, str]]:
    """Return the distinct ``(schema, table)`` pairs the query reads.

    Pairs are in order of first appearance in the text; names of common table
    expressions are not tables and are left out.  Names are spelled exactly
    as PostgreSQL spells them (unquoted names are lower case in the
    normalised text, quoted names keep their case).  A table written without
    a schema is in ``pg_catalog`` (the normalised text qualifies everything
    else).

    Raises:
        UnsupportedQueryError: the text is not a single parseable query.
    """
    query = parse_query(pg_sql)
    result: list[tuple[str, str]] = []
    for key, _table in base_tables(query):
        if key not in result:
            result.append(key)
    return result


def _normalise_tokens(text: str) -> str:
    """Apply token-level fixes before parsing.

    * ``'literal'::text`` and ``'literal'::character varying`` lose their cast:
      a string literal already is a Spark string, and sqlglot's function
      builders (``to_char``, ``date_trunc``, ``date_part``) only understand
      plain literal arguments.
    * ``"position"(string, substring)`` (PostgreSQL's function-call form) is
      renamed ``strpos``, which has the same argument order; sqlglot would
      otherwise read the arguments the other way round.
    """
    try:
        tokens = sqlglot.Dialect.get_or_raise(READ).tokenize(text)
    except TokenError as err:
        raise UnsupportedQueryError(
            f"the defining query could not be parsed as PostgreSQL SQL: {err}"
        ) from err
    edits: list[tuple[int, int, str]] = []
    count = len(tokens)
    for i, token in enumerate(tokens):
        following = tokens[i + 1] if i + 1 < count else None
        if (
            token.token_type == TokenType.IDENTIFIER
            and token.text == "position"
            and following is not None
            and following.token_type == TokenType.L_PAREN
        ):
            edits.append((token.start, token.end, "strpos"))
        elif (
            token.token_type == TokenType.STRING
            and following is not None
            and following.token_type == TokenType.DCOLON
            and i + 2 < count
            and tokens[i + 2].token_type in (TokenType.TEXT, TokenType.VARCHAR)
            and not (i + 3 < count and tokens[i + 3].token_type in (TokenType.L_PAREN, TokenType.L_BRACKET))
        ):
            edits.append((following.start, tokens[i + 2].end, ""))
    for start, end, replacement in reversed(edits):
        text = text[:start] + replacement + text[end + 1 :]
    return text


def _describe_statement(statement: exp.Expr) -> str:
    """Name a non-query statement for error messages."""
    if isinstance(statement, exp.Command):
        return str(statement.this).upper()
    return statement.key.upper()


def qualified_name(schema: str, table: str) -> str:
    """Render ``schema.table`` the way PostgreSQL would quote it."""
    return ".".join(exp.to_identifier(part).sql(dialect=READ) for part in (schema, table))


def cte_names(query: exp.Expr) -> set[str]:
    """Names of every common table expression defined anywhere in the query."""
    return {cte.alias_or_name for cte in query.find_all(exp.CTE)}


def base_tables(query: exp.Expr) -> list[tuple[tuple[str, str], exp.Table]]:
    """Every reference to a real table, as ``((schema, table), node)`` in text order."""
    ctes = cte_names(query)
    found: list[tuple[int, int, tuple[str, str], exp.Table]] = []
    for index, table in enumerate(query.find_all(exp.Table, bfs=False)):
        if not isinstance(table.this, exp.Identifier) or isinstance(table.parent, exp.Lock):
            continue
        schema = table.text("db")
        if not schema:
            if table.name in ctes:
                continue
            schema = "pg_catalog"
        start = table.this.meta.get("start")
        found.append((start if isinstance(start, int) else 1 << 62, index, (schema, table.name), table))
    found.sort(key=lambda item: (item[0], item[1]))
    return [(key, table) for _, _, key, table in found]


def replace_tables(query: exp.Expr, table_map: Mapping[tuple[str, str], str]) -> None:
    """Point every table reference at its Spark view, keeping (or adding) the alias."""
    for key, table in base_tables(query):
        original = table.this
        view = table_map[key]
        if not table.alias:
            table.set("alias", exp.TableAlias(this=exp.to_identifier(original.name, quoted=original.quoted)))
        table.set("this", exp.to_identifier(view))
        table.set("db", None)
        table.set("catalog", None)
