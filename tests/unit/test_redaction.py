"""Passwords never leave pgtrickle in readable form (pgtrickle.db.redaction)."""

from __future__ import annotations

import io
import logging

import pytest

from pgtrickle.db import redaction
from pgtrickle.db.connection import jdbc_target, redact
from pgtrickle.db.redaction import MASK, RedactingFilter, dsn_password, register_dsn, scrub


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redaction, "_secrets", set())


@pytest.mark.parametrize(
    "dsn",
    [
        "host=db user=app password=s3cr3t-Pw dbname=x",
        "host=db user=app password='s3cr3t-Pw' dbname=x",
        "postgresql://app:s3cr3t-Pw@db:5432/x",
        "postgres://app:s3cr3t-Pw@db/x?sslmode=require",
    ],
)
def test_the_password_of_any_dsn_form_is_found_and_masked(dsn: str) -> None:
    assert dsn_password(dsn) == "s3cr3t-Pw"
    assert "s3cr3t-Pw" not in scrub(f"could not connect with {dsn}: boom", dsn)
    assert "s3cr3t-Pw" not in redact(dsn) and MASK in redact(dsn)


def test_a_registered_password_is_masked_wherever_it_appears_even_url_encoded() -> None:
    pw = "p@ss w/ord;'\"x"
    register_dsn(f"host=db user=app password='{pw.replace(chr(39), chr(92) + chr(39))}'")
    text = (
        f"raw {pw} | encoded postgresql://app:p%40ss%20w%2Ford%3B%27%22x@db/x | plus p%40ss+w%2Ford%3B%27%22x"
    )
    out = scrub(text)
    assert pw not in out and "p%40ss" not in out
    assert out.count(MASK) == 3


@pytest.mark.parametrize(
    "text, leaked",
    [
        ("FATAL: connection to server failed: host=h password=hunter22 user=u", "hunter22"),
        ("props {user=u, password=hunter22, ApplicationName=x}", "hunter22"),
        ('{"password": "hunter22", "user": "u"}', "hunter22"),
        ("jdbc:postgresql://u:hunter22@h:5432/db", "hunter22"),
        ("PGPASSWORD=hunter22 psql", "hunter22"),
        ("password = 'hun ter22'", "hun ter22"),
    ],
)
def test_password_looking_values_are_masked_without_being_registered(text: str, leaked: str) -> None:
    out = scrub(text)
    assert leaked not in out and MASK in out


def test_ordinary_text_is_left_alone() -> None:
    text = "refresh of public.orders failed: division by zero (passwords table has 3 rows)"
    assert scrub(text) == text


def test_short_secrets_are_not_registered_to_avoid_masking_ordinary_text() -> None:
    register_dsn("host=h password=ab")
    assert scrub("a table named ab") == "a table named ab"


def test_jdbc_url_never_carries_the_password() -> None:
    target = jdbc_target("postgresql://app:s3cr3t-Pw@db:5432/x")
    assert "s3cr3t-Pw" not in target.url
    assert target.properties["password"] == "s3cr3t-Pw"
    # ... and the properties, printed by anyone, are scrubbed (the password was registered).
    assert "s3cr3t-Pw" not in scrub(str(target.options()))


def test_log_records_messages_arguments_and_tracebacks_are_scrubbed() -> None:
    register_dsn("postgresql://app:s3cr3t-Pw@db/x")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger("pgtrickle.test.redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.error("connecting to %s failed", "postgresql://app:s3cr3t-Pw@db/x")
        try:
            raise RuntimeError("driver said: password s3cr3t-Pw rejected")
        except RuntimeError:
            logger.exception("refresh failed")
    finally:
        logger.removeHandler(handler)
    out = stream.getvalue()
    assert "s3cr3t-Pw" not in out
    assert "connecting to postgresql://app:****@db/x failed" in out
    assert "RuntimeError: driver said: password **** rejected" in out
