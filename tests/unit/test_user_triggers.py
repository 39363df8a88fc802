"""Which user triggers a refresh disables, and what it tells listeners (pure decisions)."""

from __future__ import annotations

import pytest

from pgtrickle.errors import ConfigError
from pgtrickle.refresh.user_triggers import Policy, parse_mode, policy, statements


@pytest.mark.parametrize("value, mode", [(None, "auto"), ("auto", "auto"), (" ON ", "on"), ("Off", "off")])
def test_parse_mode_normalises(value, mode) -> None:  # type: ignore[no-untyped-def]
    assert parse_mode(value) == mode


@pytest.mark.parametrize("value", ["", "yes", "true", "full", "disable"])
def test_parse_mode_rejects_anything_else(value: str) -> None:
    with pytest.raises(ConfigError, match="invalid user_triggers"):
        parse_mode(value)


@pytest.mark.parametrize(
    "mode, action, expected",
    [
        ("auto", "DIFFERENTIAL", Policy(suppress=False, notify=False)),
        ("auto", "FULL", Policy(suppress=True, notify=True)),
        ("on", "DIFFERENTIAL", Policy(suppress=False, notify=False)),
        ("on", "FULL", Policy(suppress=False, notify=False)),
        ("off", "DIFFERENTIAL", Policy(suppress=True, notify=True)),
        ("off", "FULL", Policy(suppress=True, notify=True)),
    ],
)
def test_policy(mode: str, action: str, expected: Policy) -> None:
    assert policy(mode, action) == expected


def test_statements_disable_only_enabled_triggers_and_restore_their_mode() -> None:
    disable, restore = statements('"s"."t"', [("a", "O"), ("b", "D"), ("c", "A"), ('we"ird', "R")])
    assert disable == [
        'ALTER TABLE "s"."t" DISABLE TRIGGER "a"',
        'ALTER TABLE "s"."t" DISABLE TRIGGER "c"',
        'ALTER TABLE "s"."t" DISABLE TRIGGER "we""ird"',
    ]
    assert restore == [
        'ALTER TABLE "s"."t" ENABLE TRIGGER "a"',
        'ALTER TABLE "s"."t" ENABLE ALWAYS TRIGGER "c"',
        'ALTER TABLE "s"."t" ENABLE REPLICA TRIGGER "we""ird"',
    ]


def test_statements_without_triggers() -> None:
    assert statements('"t"', []) == ([], [])
