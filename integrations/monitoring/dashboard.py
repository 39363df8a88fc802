"""The pgtrickle Grafana dashboard, built as code with Grafana's own SDK (``grafana-foundation-sdk``).

Regenerate the committed JSON after a change here::

    python -m integrations.monitoring.dashboard            # writes pgtrickle-dashboard.json
    python -m integrations.monitoring.dashboard --check    # exit 1 when the committed JSON is out of date

The dashboard reads only the daemon's Prometheus metrics (src/pgtrickle/ops/metrics.py). It has two
variables: ``datasource`` (any Prometheus data source, chosen at import) and ``st`` (stream tables).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import common, dashboard, prometheus, stat, statetimeline, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_model
from grafana_foundation_sdk.models import dashboard as model

JSON_PATH = Path(__file__).with_name("pgtrickle-dashboard.json")
UID = "pgtrickle-overview"

DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
ST = 'st=~"$st"'

STATUS_CODES = {"INITIALIZING": (1, "blue"), "ACTIVE": (2, "green"), "SUSPENDED": (3, "orange"),
                "ERROR": (4, "red")}
"""The stream table status as a number, so a state timeline can show it (value mappings turn it back)."""


def status_code_expr() -> str:
    """One series per stream table whose value is the code of its current status (STATUS_CODES)."""
    parts = [f'pgtrickle_stream_table_status{{{ST},status="{status}"}} * {code}'
             for status, (code, _) in STATUS_CODES.items()]
    return "max by (st) (" + " or ".join(parts) + ")"


def _query(expr: str, legend: str = "", ref: str = "A") -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DATASOURCE)
    return q.legend_format(legend) if legend else q


def _mapping(values: dict[str, tuple[str, str]]) -> list[model.ValueMapping]:
    return [model.ValueMap(options={
        value: model.ValueMappingResult(text=text, color=color, index=i)
        for i, (value, (text, color)) in enumerate(values.items())})]


def _thresholds(*steps: tuple[float | None, str]) -> dashboard.ThresholdsConfig:
    return dashboard.ThresholdsConfig().mode(model.ThresholdsMode.ABSOLUTE).steps(
        [model.Threshold(value=value, color=color) for value, color in steps])


def _legend() -> common.VizLegendOptions:
    return (common.VizLegendOptions().display_mode(common_model.LegendDisplayMode.LIST)
            .placement(common_model.LegendPlacement.BOTTOM).show_legend(True))


def _tooltip() -> common.VizTooltipOptions:
    return common.VizTooltipOptions().mode(common_model.TooltipDisplayMode.MULTI).sort(
        common_model.SortOrder.DESCENDING)


def _series(title: str, description: str, unit: str, *queries: prometheus.Dataquery,
            width: int = 12) -> timeseries.Panel:
    panel = (timeseries.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE)
             .height(8).span(width).legend(_legend()).tooltip(_tooltip()))
    for q in queries:
        panel = panel.with_target(q)
    return panel


def _stat(title: str, description: str, query: prometheus.Dataquery, unit: str = "none",
          thresholds: dashboard.ThresholdsConfig | None = None) -> stat.Panel:
    panel = (stat.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE)
             .height(4).span(6).with_target(query)
             .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
             .graph_mode(common_model.BigValueGraphMode.AREA).color_mode(common_model.BigValueColorMode.VALUE)
             .justify_mode(common_model.BigValueJustifyMode.AUTO).text_mode(common_model.BigValueTextMode.AUTO)
             .orientation(common_model.VizOrientation.AUTO))
    return panel.thresholds(thresholds) if thresholds is not None else panel


def _timeline(title: str, description: str, query: prometheus.Dataquery,
              mappings: list[model.ValueMapping]) -> statetimeline.Panel:
    return (statetimeline.Panel().title(title).description(description).datasource(DATASOURCE)
            .height(8).span(12).with_target(query).mappings(mappings)
            .show_value(common_model.VisibilityMode.AUTO).merge_values(True).legend(_legend()))


def build() -> model.Dashboard:
    """The dashboard model."""
    rate = "$__rate_interval"
    b = (dashboard.Dashboard("pgtrickle").uid(UID)
         .description("Stream tables kept fresh by pgtrickle: freshness, refreshes, gates, change capture.")
         .tags(["pgtrickle", "postgresql", "spark"]).editable().time("now-6h", "now").refresh("30s")
         .tooltip(model.DashboardCursorSync.CROSSHAIR)
         .with_variable(dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"))
         .with_variable(dashboard.QueryVariable("st").label("Stream table").datasource(DATASOURCE)
                        .query("label_values(pgtrickle_stream_table_status, st)")
                        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(model.VariableSort.ALPHABETICAL_ASC)
                        .multi(True).include_all(True).all_value(".*")))

    b = b.with_row(dashboard.Row("Overview"))
    b = b.with_panel(_stat(
        "Stream tables by status",
        "How many of the selected stream tables are in each status.",
        _query(f"sum by (status) (pgtrickle_stream_table_status{{{ST}}})", "{{status}}")))
    b = b.with_panel(_stat(
        "Open circuit breakers",
        "Stream tables whose circuit breaker holds refreshes back.",
        _query(f"sum(pgtrickle_circuit_breaker_open{{{ST}}})"),
        thresholds=_thresholds((None, "green"), (1, "red"))))
    b = b.with_panel(_stat(
        "Failed refreshes (1h)",
        "Refreshes that failed in the last hour.",
        _query(f"sum(increase(pgtrickle_refresh_failures_total{{{ST}}}[1h]))"),
        thresholds=_thresholds((None, "green"), (1, "orange"))))
    b = b.with_panel(_stat(
        "Catalog snapshot age",
        "Seconds since the daemon last read the state series from the catalog; above a minute the daemon "
        "is stuck or down.",
        _query("max(pgtrickle_catalog_snapshot_age_seconds)"), unit="s",
        thresholds=_thresholds((None, "green"), (60, "red"))))

    status_map = {str(code): (status, color) for status, (code, color) in STATUS_CODES.items()}
    b = b.with_row(dashboard.Row("Freshness"))
    b = b.with_panel(_series(
        "Staleness",
        "Age of each stream table's data (now minus its data timestamp).", "s",
        _query(f"pgtrickle_staleness_seconds{{{ST}}}", "{{st}}")))
    b = b.with_panel(_timeline(
        "Status",
        "Each stream table's status over time.",
        _query(status_code_expr(), "{{st}}"), _mapping(status_map)))

    b = b.with_row(dashboard.Row("Refreshes"))
    b = b.with_panel(_series(
        "Refreshes by action",
        "Refresh outcomes per second: FULL, DIFFERENTIAL, NO_DATA (nothing changed) and SKIP (a gate held "
        "it back).", "ops",
        _query(f"sum by (st, action) (rate(pgtrickle_refreshes_total{{{ST}}}[{rate}]))",
               "{{st}} {{action}}")))
    b = b.with_panel(_series(
        "Refresh duration (p95)",
        "95th percentile wall time of refreshes that ran, by mode.", "s",
        _query("histogram_quantile(0.95, sum by (st, mode, le) "
               f"(rate(pgtrickle_refresh_duration_seconds_bucket{{{ST}}}[{rate}])))", "{{st}} {{mode}}")))
    b = b.with_panel(_series(
        "Spark job time (p95)",
        "95th percentile Spark job time of refreshes, by mode.", "s",
        _query("histogram_quantile(0.95, sum by (st, mode, le) "
               f"(rate(pgtrickle_spark_job_seconds_bucket{{{ST}}}[{rate}])))", "{{st}} {{mode}}")))
    b = b.with_panel(_series(
        "Rows applied",
        "Rows refreshes inserted into or deleted from stream tables, per second.", "rowsps",
        _query(f"sum by (st, mode, change) (rate(pgtrickle_refresh_rows_total{{{ST}}}[{rate}]))",
               "{{st}} {{mode}} {{change}}")))

    b = b.with_row(dashboard.Row("Gates and errors"))
    b = b.with_panel(_timeline(
        "Circuit breaker",
        "Open while an anomalous change volume holds the stream table's refreshes back "
        "(pgtrickle.reset_circuit_breaker closes it).",
        _query(f"pgtrickle_circuit_breaker_open{{{ST}}}", "{{st}}"),
        _mapping({"0": ("closed", "green"), "1": ("open", "red")})))
    b = b.with_panel(_series(
        "Skipped refreshes by gate",
        "Refreshes a gate skipped: reason circuit_breaker, watermark (a watermark group is not aligned yet) "
        "or other.", "short",
        _query(f"sum by (st, reason) (increase(pgtrickle_refresh_skips_total{{{ST}}}[{rate}]))",
               "{{st}} {{reason}}")))
    b = b.with_panel(_series(
        "Failed refreshes",
        "Failed refreshes per interval.", "short",
        _query(f"sum by (st) (increase(pgtrickle_refresh_failures_total{{{ST}}}[{rate}]))", "{{st}}")))
    b = b.with_panel(_series(
        "Consecutive errors",
        "Failed refreshes in a row; at the auto-suspend threshold the stream table is suspended.", "short",
        _query(f"pgtrickle_consecutive_errors{{{ST}}}", "{{st}}")))

    b = b.with_row(dashboard.Row("Change capture"))
    b = b.with_panel(_series(
        "Change buffer rows",
        "Rows in each source's change buffer (a statistics estimate; consumed rows stay until cleanup).",
        "short", _query("pgtrickle_change_buffer_rows", "{{source}}")))
    b = b.with_panel(_series(
        "Change buffer size",
        "Size of each source's change buffer.", "bytes",
        _query("pgtrickle_change_buffer_bytes", "{{source}}")))
    b = b.with_panel(_series(
        "Replication slot lag",
        "WAL retained by pgtrickle's replication slot (WAL capture).", "bytes",
        _query("pgtrickle_slot_lag_bytes", "{{slot}}")))
    b = b.with_panel(_timeline(
        "Change capture broken",
        "A capture object of the source is missing or disabled: changes may be lost until "
        "`pgtrickle install` repairs it.",
        _query("pgtrickle_change_capture_broken", "{{source}}"),
        _mapping({"0": ("ok", "green"), "1": ("broken", "red")})))
    built = b.build()
    for number, panel in enumerate(built.panels or [], start=1):
        panel.id_val = number  # stable, unique panel ids (links to a panel stay valid across regenerations)
    return built


def render() -> str:
    """The dashboard as the JSON Grafana imports (stable: sorted keys, trailing newline)."""
    return json.dumps(build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def queries(document: dict) -> list[tuple[str, str, str]]:
    """(panel title, PromQL expression, legend format) of every panel target in a dashboard document."""
    out = []
    for panel in document.get("panels", []):
        for target in panel.get("targets", []):
            out.append((panel.get("title", ""), target["expr"], target.get("legendFormat", "")))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the committed JSON is out of date")
    parser.add_argument("--output", type=Path, default=JSON_PATH)
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date: run python -m integrations.monitoring.dashboard",
                  file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
