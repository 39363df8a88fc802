"""Which metrics (and which of their labels) the dashboard and the alerting rules use.

Pure functions over PromQL, parsed with ``promql-parser`` (Python bindings of a maintained PromQL parser),
so a test can check every metric a panel or a rule reads against what a running daemon serves.

The labels a selector is *expected* to carry are its own matchers plus the labels the expression around
it reads from it: the ``by (...)`` of an aggregation over it, the ``on (...)`` / ``group_left (...)`` of a
vector match it takes part in, and — at the top — the labels of the panel's legend (``{{st}}``) or of the
alert's templates (``{{ $labels.st }}``). A legend or template label that the expression's own
aggregation drops is an error in the query, reported as one.
"""

from __future__ import annotations

import re
from pathlib import Path

import promql_parser as pp
import yaml

RULES_PATH = Path(__file__).with_name("pgtrickle-alerts.yml")

_LEGEND = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")
_TEMPLATE = re.compile(r"\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)")
_GRAFANA_RANGES = re.compile(r"\$(?:__rate_interval|__interval|__range)\b"
                             r"|\$\{(?:__rate_interval|__interval|__range)\}")


class QueryError(ValueError):
    """A query reads a label its own expression does not carry, or names no pgtrickle metric."""


def _walk(node: object, required: frozenset[str], out: dict[str, set[str]]) -> None:
    if isinstance(node, pp.VectorSelector):
        labels = out.setdefault(node.name, set())
        labels.update(required)
        labels.update(m.name for m in node.matchers.matchers if m.name != "__name__")
    elif isinstance(node, pp.MatrixSelector):
        _walk(node.vector_selector, required, out)
    elif isinstance(node, pp.AggregateExpr):
        modifier = node.modifier
        if modifier is not None and modifier.type == pp.AggModifierType.By:
            if not required <= set(modifier.labels):
                raise QueryError(f"{node}: reads label(s) {sorted(required - set(modifier.labels))} "
                                 f"that its aggregation drops")
            inner = frozenset(modifier.labels)
        elif modifier is not None:  # without (...)
            inner = required - set(modifier.labels)
        else:
            if required:
                raise QueryError(f"{node}: reads label(s) {sorted(required)} that its aggregation drops")
            inner = frozenset()
        _walk(node.expr, inner, out)
    elif isinstance(node, pp.BinaryExpr):
        modifier = node.modifier
        extra: set[str] = set()
        if modifier is not None:
            if modifier.matching is not None and modifier.matching.type == pp.LabelModifierType.Include:
                extra.update(modifier.matching.labels)
            extra.update(modifier.group_labels or [])
        for side in (node.lhs, node.rhs):
            _walk(side, required | extra, out)
    elif isinstance(node, pp.Call):
        for arg in node.args:
            _walk(arg, required, out)
    elif isinstance(node, (pp.ParenExpr, pp.UnaryExpr, pp.SubqueryExpr)):
        _walk(node.expr, required, out)


def uses(expr: str, *templates: str) -> dict[str, set[str]]:
    """Metric sample names in ``expr`` and the labels the expression (and its legend/annotation templates)
    expects each to carry. Grafana's range variables ($__rate_interval, ...) are read as a range."""
    tree = pp.parse(_GRAFANA_RANGES.sub("5m", expr))
    read = frozenset(label for text in templates for label in _LEGEND.findall(text) + _TEMPLATE.findall(text))
    out: dict[str, set[str]] = {}
    _walk(tree, read, out)
    if not any(name.startswith("pgtrickle_") for name in out):
        raise QueryError(f"no pgtrickle metric in {expr!r}")
    return out


def merge(into: dict[str, set[str]], more: dict[str, set[str]]) -> dict[str, set[str]]:
    for name, labels in more.items():
        into.setdefault(name, set()).update(labels)
    return into


def dashboard_uses(document: dict) -> dict[str, set[str]]:
    """Every metric the dashboard's panels and variables read, with the labels they expect."""
    out: dict[str, set[str]] = {}
    for panel in document.get("panels", []):
        for target in panel.get("targets", []):
            try:
                merge(out, uses(target["expr"], target.get("legendFormat", "")))
            except ValueError as e:
                raise QueryError(f"panel {panel.get('title')!r}: {e}") from e
    for variable in document.get("templating", {}).get("list", []):
        query = variable.get("query")
        match = isinstance(query, str) and re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query)
        if match:
            merge(out, {match.group(1): {match.group(2)}})
    return out


def rules_uses(text: str) -> dict[str, set[str]]:
    """Every metric the alerting rules read, with the labels their expressions and annotations expect."""
    out: dict[str, set[str]] = {}
    for group in yaml.safe_load(text)["groups"]:
        for rule in group["rules"]:
            templates = [*rule.get("annotations", {}).values(), *rule.get("labels", {}).values()]
            try:
                merge(out, uses(rule["expr"], *templates))
            except ValueError as e:
                raise QueryError(f"rule {rule.get('alert')!r}: {e}") from e
    return out


def missing(used: dict[str, set[str]], served: dict[str, set[str]]) -> list[str]:
    """What ``used`` reads that ``served`` (sample name -> label names) lacks, one problem a line."""
    problems = []
    for name, labels in sorted(used.items()):
        if name not in served:
            problems.append(f"{name}: not served")
        elif not labels <= served[name]:
            lacking = sorted(labels - served[name])
            problems.append(f"{name}: lacks label(s) {lacking} (has {sorted(served[name])})")
    return problems
