"""What the lowering's helper modules use of the lowerer (:class:`pgtrickle.dvm.lower.Lowerer`).

``lower_from`` and ``lower_subquery`` recurse into whole queries (a derived
table, a subquery) through this interface, so they depend on it rather
than on ``lower`` itself, which imports them: the modules stay acyclic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from sqlglot import exp

from pgtrickle.dvm.ir import Aggregate, Named, Node, Values
from pgtrickle.dvm.lower_scope import Names, Scope


class LowererApi(Protocol):
    names: Names
    shared: set[int]

    def scan(self, schema: str, table: str) -> tuple[Node, list[str]]: ...

    def one_row(self) -> Values: ...

    def cte(self, name: str, ctes: Mapping[str, object]) -> tuple[Node, list[str]]: ...

    def query(
        self, query: exp.Expr, outer: Scope | None, ctes: Mapping[str, object], root: bool = False
    ) -> tuple[Node, list[str]]: ...

    def aggregate(
        self, rows: Node, scope: Scope, keys: Named, exprs: Sequence[exp.Expr]
    ) -> tuple[Aggregate, list[exp.Expr]]: ...

    @staticmethod
    def base_name(expr: exp.Expr) -> str: ...

    @staticmethod
    def has_subquery(node: exp.Expr) -> bool: ...
