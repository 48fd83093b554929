"""The dashboard's time-series panels as a PNG, from a Prometheus that scraped mirus, where Grafana is not at hand.

    python deploy/monitoring/render_panels.py --prometheus http://127.0.0.1:9090 --minutes 15 --out panels.png

Each panel's queries are the dashboard's own (mirus-dashboard.json), with its variables set to every connector, the
10 worst partitions and a 1-minute rate interval, evaluated by Prometheus's range API; legends follow the panels'
legend formats. docs/monitoring-panels.png was made this way from a `mirus dev` session.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

import requests
from matplotlib.figure import Figure

DASHBOARD = Path(__file__).with_name("mirus-dashboard.json")
VARIABLES = {"$connector": ".*", "$worst": "10", "$__rate_interval": "1m"}
MAX_LINES = 8  # per panel: the most recent value's highest, so a legend stays readable
UNITS = {"rps": "records/s", "Bps": "bytes/s", "s": "seconds", "short": "records", "none": ""}


def with_variables(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or str(labels)


def query_range(prometheus: str, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    response = requests.get(
        f"{prometheus}/api/v1/query_range",
        params={"query": expr, "start": start, "end": end, "step": step},
        timeout=60,
    )
    response.raise_for_status()
    return response.json()["data"]["result"]


def render(prometheus: str, minutes: float, out: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] == "timeseries"]
    end = time.time()
    start, step = end - minutes * 60, max(minutes * 60 / 240, 5)
    columns = 2
    rows = (len(panels) + columns - 1) // columns
    figure = Figure(figsize=(14, 3.2 * rows))
    axes = figure.subplots(rows, columns, squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        lines = []
        for target in panel["targets"]:
            for series in query_range(prometheus, with_variables(target["expr"]), start, end, step):
                points = [(float(t) - end, float(v)) for t, v in series["values"]]
                lines.append((points, legend(target["legendFormat"], series["metric"])))
        lines.sort(key=lambda line: line[0][-1][1], reverse=True)
        for points, label in lines[:MAX_LINES]:
            ax.plot([t / 60 for t, _ in points], [v for _, v in points], label=label, linewidth=1.2)
        ax.set_title(with_variables(panel["title"]).replace(".*", "all"), fontsize=10)
        ax.set_xlabel("minutes ago", fontsize=8)
        ax.set_ylabel(UNITS.get(panel["fieldConfig"]["defaults"]["unit"], ""), fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if lines:
            ax.legend(fontsize=7, loc="upper left")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    for ax in list(axes.flat)[len(panels) :]:
        ax.remove()
    figure.suptitle(f"{dashboard['title']}: the last {minutes:.0f} minutes", fontsize=12)
    figure.tight_layout()
    figure.savefig(out, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", required=True, help="Prometheus base URL")
    parser.add_argument("--minutes", type=float, default=15.0, help="how far back the panels go")
    parser.add_argument("--out", type=Path, required=True, help="PNG to write")
    args = parser.parse_args()
    render(args.prometheus, args.minutes, args.out)


if __name__ == "__main__":
    main()
