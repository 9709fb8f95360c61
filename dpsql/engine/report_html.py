"""Writing a report's files: ``report.html`` (self-contained), ``results.json``, one file per query.

The HTML is rendered by Jinja2 (autoescaped) from ``templates/report.html.j2``, shipped in the
package; charts are inline SVG (``dpsql.engine.report_charts``). Nothing is fetched when the page
is opened: no script, stylesheet, font or image lives outside the file.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
from importlib.metadata import version
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from dpsql.engine.report import ReportPlan, results_document, write_json
from dpsql.engine.report_charts import chart_svg
from dpsql.engine.results import QueryResult

__all__ = ["write_report"]

_ENVIRONMENT = Environment(
    loader=PackageLoader("dpsql.engine", "templates"),
    autoescape=select_autoescape(["html", "j2"]),
    trim_blocks=True,
    lstrip_blocks=True,
)


def write_report(
    plan: ReportPlan, audit: dict[str, Any], results: dict[str, QueryResult], directory: Path
) -> None:
    """Write ``report.html``, ``results.json`` and ``<query>.csv`` (or ``.json``) into
    ``directory``."""
    queries = []
    for planned in plan.queries:
        result = results[planned.name]
        file = f"{planned.name}.{planned.spec.format}"
        _write_query(result, directory / file)
        columns, rows = result.interval_table()
        queries.append(
            {
                **planned.to_dict(),
                "columns": columns,
                "rows": [[_shown(v) for v in row] for row in rows],
                "measures": result.measures,
                "chart": chart_svg(result, planned.spec.chart, planned.spec.title or planned.name),
                "summary": planned.plan.summary(),
                "file": file,
            }
        )
    html = _ENVIRONMENT.get_template("report.html.j2").render(
        plan=plan.to_dict(),
        description=plan.spec.description,
        queries=queries,
        audit=audit,
        dataset=audit.get("dataset", ""),
        period=audit.get("period"),
        after=audit.get("budget_after", []),
        event_tree=json.dumps(audit["entry"]["payload"], indent=1),
        generated=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M"),
        version=version("dpsql"),
    )
    (directory / "report.html").write_text(html, encoding="utf-8")
    write_json(directory / "results.json", results_document(plan, audit, results))


def _write_query(result: QueryResult, path: Path) -> None:
    if path.suffix == ".json":
        write_json(path, result.to_dict())
        return
    columns, rows = result.interval_table()
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        writer.writerows(rows)


def _shown(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:.6g}" if value == value else "–"
    return "–" if value is None else value
