"""Which metrics (and which of their labels) the dashboard and the alerting rules use.

Pure functions over PromQL text, so a test can check every metric a panel or a rule reads against what a
running daemon serves. The extraction is deliberately simple and conservative: it knows the PromQL
constructs our own queries use (selectors with matchers, ``by``/``without``/``on``/``ignoring``/
``group_left``/``group_right`` label lists, ``{{label}}`` legends and ``{{ $labels.x }}`` templates), and
it attributes the labels of an expression's grouping clauses to every metric of that expression — so an
expression must only combine metrics that share those labels, which is what a correct query does anyway.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

RULES_PATH = Path(__file__).with_name("pgtrickle-alerts.yml")

METRIC_PREFIX = "pgtrickle_"
_SELECTOR = re.compile(r"\b(pgtrickle_[a-zA-Z0-9_]+)\s*(\{[^}]*\})?")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_LEGEND = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")
_TEMPLATE = re.compile(r"\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)")
_NOT_LABELS = {"le"}  # grouping by le is how histogram_quantile reads a histogram's buckets: a _bucket label


def uses(expr: str, *templates: str) -> dict[str, set[str]]:
    """Metric sample names in ``expr`` and the labels the expression (or its legend/annotation templates)
    expects each to carry."""
    if "pgtrickle_" not in expr:
        raise ValueError(f"no pgtrickle metric in {expr!r}")
    grouped: set[str] = set()
    for labels in _GROUPING.findall(expr):
        grouped.update(label.strip() for label in labels.split(",") if label.strip())
    for text in templates:
        grouped.update(_LEGEND.findall(text))
        grouped.update(_TEMPLATE.findall(text))
    out: dict[str, set[str]] = {}
    for name, matchers in _SELECTOR.findall(expr):
        labels = out.setdefault(name, set())
        labels.update(_MATCHER.findall(matchers or ""))
        labels.update(grouped - (set() if name.endswith("_bucket") else _NOT_LABELS))
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
            merge(out, uses(target["expr"], target.get("legendFormat", "")))
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
            merge(out, uses(rule["expr"], *templates))
    return out


def missing(used: dict[str, set[str]], served: dict[str, set[str]]) -> list[str]:
    """What ``used`` reads that ``served`` (sample name -> label names) lacks, one problem a line."""
    problems = []
    for name, labels in sorted(used.items()):
        if name not in served:
            problems.append(f"{name}: not served")
        elif not labels <= served[name]:
            problems.append(f"{name}: lacks label(s) {sorted(labels - served[name])} (has {sorted(served[name])})")
    return problems
