"""Connections to the user's PostgreSQL: psycopg for pgtrickle, JDBC for Spark.

A DSN is a libpq connection string or URI. Passwords never leave this module
in readable form: :func:`redact` is what logs, errors and ``status`` show.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgtrickle.config import Settings
from pgtrickle.db.redaction import register_dsn, scrub
from pgtrickle.errors import ConfigError


def resolve_dsn(settings: Settings, *, start_embedded: bool = True) -> str:
    """The DSN to use: the configured one, else the embedded server's."""
    if settings.dsn:
        register_dsn(settings.dsn)
        try:
            conninfo_to_dict(settings.dsn)
        except psycopg.ProgrammingError as exc:
            raise ConfigError(f"invalid DSN {redact(settings.dsn)}: {scrub(exc, settings.dsn)}") from None
        return settings.dsn
    from pgtrickle.db.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(settings.data_dir, settings.embedded_port)
    if start_embedded:
        server.start()
    dsn = server.dsn()
    register_dsn(dsn)
    return dsn


def redact(dsn: str) -> str:
    """The DSN with any password replaced by ``****``."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparseable DSN>"
    if "password" in params:
        params["password"] = "****"
    return make_conninfo("", **params)


def connect(dsn: str, *, autocommit: bool = True, application_name: str = "pgtrickle") -> psycopg.Connection:
    register_dsn(dsn)
    try:
        return psycopg.connect(dsn, autocommit=autocommit, application_name=application_name)
    except psycopg.OperationalError as exc:
        raise ConfigError(f"cannot connect to PostgreSQL at {redact(dsn)}: {scrub(exc, dsn)}") from None


SPARK_APPLICATION_NAME = "pgtrickle-spark"
"""``application_name`` of Spark's JDBC sessions (reads and writes), as ``pg_stat_activity`` shows it."""


@dataclass(frozen=True)
class JdbcTarget:
    """Where Spark's JDBC reader and writer connect."""

    url: str
    properties: dict[str, str]

    def options(self) -> dict[str, str]:
        return {"url": self.url, "driver": "org.postgresql.Driver", **self.properties}


def jdbc_target(dsn: str) -> JdbcTarget:
    """Translate a libpq DSN to a JDBC URL and connection properties.

    The password goes in the properties, never in the URL (Spark shows URLs in
    plans and errors; it masks option values whose key mentions a password).
    """
    register_dsn(dsn)
    params = conninfo_to_dict(dsn)
    host = str(params.get("host") or params.get("hostaddr") or "localhost")
    if host.startswith("/"):
        raise ConfigError(
            "Spark connects over TCP; the DSN names a Unix socket directory "
            f"({host}). Give a host name or address."
        )
    port = str(params.get("port") or "5432")
    dbname = str(params.get("dbname") or params.get("user") or "postgres")
    props: dict[str, str] = {
        "user": str(params.get("user") or ""),
        "password": str(params.get("password") or ""),
        # Let PostgreSQL convert strings Spark sends into the column types.
        "stringtype": "unspecified",
        "reWriteBatchedInserts": "true",
    }
    if params.get("sslmode"):
        props["sslmode"] = str(params["sslmode"])
    host_part = f"[{host}]" if ":" in host else host
    # In the URL, not the properties: Spark lower-cases option names, and the driver ignores an
    # "applicationname" property (the sessions showed up as "PostgreSQL JDBC Driver").
    url = f"jdbc:postgresql://{host_part}:{port}/{quote(dbname, safe='')}?ApplicationName={SPARK_APPLICATION_NAME}"
    return JdbcTarget(url=url, properties=props)
