"""Charts of the reports as PNG images (matplotlib, no display), small enough to travel in Dagster metadata."""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from datetime import datetime

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.dates as mdates
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter

_SIZE = (9.0, 3.6)
_DPI = 90
# Latency ticks an operator reads at a glance (ms): 10ms … 1d, Mirus's bucket bounds among them.
_DURATION_TICKS = (
    10,
    100,
    1_000,
    10_000,
    60_000,
    300_000,
    600_000,
    1_800_000,
    3_600_000,
    21_600_000,
    43_200_000,
    86_400_000,
    604_800_000,
)


def duration_label(ms: float, _pos: object = None) -> str:
    """Milliseconds as an operator reads them: 850ms, 12s, 7.5m, 3.2h, 1.5d."""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)):
        if ms >= size:
            value = ms / size
            shown = f"{value:.0f}" if value >= 10 else f"{value:.1f}".removesuffix(".0")
            return shown + unit
    return f"{ms:.0f}ms"


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=_DPI)
    plt.close(fig)
    return buffer.getvalue()


def _time_axis(ax: plt.Axes) -> None:
    locator = mdates.AutoDateLocator(minticks=3, maxticks=8)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    ax.grid(True, alpha=0.3)


def _empty(ax: plt.Axes, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


def latency_chart(rows: Sequence[Mapping[str, object]]) -> bytes:
    """The estate's p50/p95/p99 and max replication latency per time step (log scale)."""
    fig, ax = plt.subplots(figsize=_SIZE)
    ax.set_title("Replication latency, all connectors (UTC)")
    if not rows:
        _empty(ax, "no replicated records in the window")
        return _png(fig)
    times = [r["time"] for r in rows]
    for column, label, style in (
        ("max_ms", "max", ":"),
        ("p99_ms", "p99", "-"),
        ("p95_ms", "p95", "-"),
        ("p50_ms", "p50", "-"),
    ):
        # matplotlib's stubs want floats for x; it plots datetimes.
        ax.plot(times, [max(float(r[column]), 1.0) for r in rows], style, marker=".", label=label)  # type: ignore[arg-type]
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    ticks: list[float] = [t for t in _DURATION_TICKS if low <= t <= high] or [low, high]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(FuncFormatter(duration_label))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    _time_axis(ax)
    return _png(fig)


def series_chart(title: str, series: Mapping[str, Sequence[tuple[datetime, float]]], unit: str, empty: str) -> bytes:
    """One line per named series (e.g. lag per topic, records/s per connector)."""
    fig, ax = plt.subplots(figsize=_SIZE)
    ax.set_title(title)
    if not series:
        _empty(ax, empty)
        return _png(fig)
    for name, points in series.items():
        # matplotlib's stubs want floats for x; it plots datetimes.
        ax.plot([t for t, _ in points], [v for _, v in points], marker=".", label=name)  # type: ignore[arg-type]
    ax.set_ylabel(unit)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="x-small")
    _time_axis(ax)
    return _png(fig)


def missing_chart(counts: Mapping[str, Mapping[str, int]]) -> bytes:
    """Missing partitions per connector, stacked by reason."""
    fig, ax = plt.subplots(figsize=(_SIZE[0], max(1.6, 0.45 * len(counts) + 1.0)))
    ax.set_title("Source partitions without a destination partition")
    if not counts:
        _empty(ax, "none: every selected source partition has a destination partition")
        return _png(fig)
    connectors = sorted(counts)
    reasons = sorted({reason for per in counts.values() for reason in per})
    left = [0] * len(connectors)
    for reason in reasons:
        values = [counts[c].get(reason, 0) for c in connectors]
        ax.barh(connectors, values, left=left, label=reason)
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_xlabel("partitions")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    ax.grid(True, axis="x", alpha=0.3)
    return _png(fig)


def markdown_image(alt: str, png: bytes) -> str:
    """Markdown that shows the PNG inline (a data URI: no file server needed)."""
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})"
