"""Scan: the change of a base relation is its change buffer over the window, ``Delta(scan)``.

The fold calls a rule only when something under its node changed, so a scan reaching here is of
a relation with pending changes.
"""

from __future__ import annotations

from pgtrickle.dvm import ir
from pgtrickle.dvm.rules.common import Context


def delta(node: ir.Scan, ctx: Context) -> ir.Node | None:
    return ir.Delta(node)
