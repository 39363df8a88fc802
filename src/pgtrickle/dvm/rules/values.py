"""Values: a constant relation never changes; its change is empty (``None``)."""

from __future__ import annotations

from pgtrickle.dvm import ir
from pgtrickle.dvm.rules.common import Context


def delta(node: ir.Values, ctx: Context) -> ir.Node | None:
    return None
