"""``pq report EVENTS --html PAGE``: ``analyze()``'s figures and plots as one self-contained HTML page,
each figure in a ``<td data-figure="<queue>|<tenant>|<name>">`` (tenant empty for the queue's own)."""

from __future__ import annotations

import base64
import html
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .log import table

if TYPE_CHECKING:
    import pandas as pd


#: Figures of the per-queue table: (column of ``summary``, label, format).
QUEUE_FIGURES = table("""
    events                | events                                            | int
    enqueued              | enqueued                                          | int
    delivered             | deliveries                                        | int
    acked                 | acked                                             | int
    requeued              | requeued                                          | int
    expired               | leases expired                                    | int
    dead                  | dead-lettered                                     | int
    span_s                | span (s)                                          | f1
    acked_per_s           | acked per second                                  | f1
    wait_p50_ms           | wait p50 (ms)                                     | f1
    wait_p99_ms           | wait p99 (ms)                                     | f1
    rank_error_mean       | rank error, mean                                  | f3
    rank_error_max        | rank error, max                                   | int
    rank_exact_share      | deliveries with no rank error                     | f3
    jain_mean             | Jain's index, mean over windows                   | f3
    jain_min              | Jain's index, lowest window                       | f3
    jain_within_rank_mean | Jain's index within a priority, mean over windows | f3
    jain_within_rank_min  | Jain's index within a priority, lowest window     | f3
""")
#: Figures of the per-tenant table: (column of ``waits`` or ``redeliveries``, label, format).
TENANT_FIGURES = table("""
    entries      | entries             | int
    deliveries   | deliveries          | int
    share        | share of deliveries | f3
    wait_p50_ms  | wait p50 (ms)       | f1
    wait_p90_ms  | wait p90 (ms)       | f1
    wait_p99_ms  | wait p99 (ms)       | f1
    redeliveries | redeliveries        | int
    requeues     | requeues            | int
    expired      | leases expired      | int
    dead         | dead-lettered       | int
    held_ms      | worker time (ms)    | int
    worker_share | share of worker time | f3
""")
#: The frames of ``analyze()``, besides ``summary``, that a queue's plots and tables are drawn from.
FRAMES = ("share", "waits", "fairness", "throughput", "rank_error", "redeliveries", "worker_time")
TITLE = "celery-pq event log report"


def fmt(value, kind: str) -> str:
    """A figure as the page states it ("-" for none)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if kind == "int":
        return str(int(value))
    return f"{float(value):.{int(kind[1:])}f}"


def tenant_label(tenant: str) -> str:
    return tenant if tenant else "(no tenant)"


@dataclass
class Report:
    html: str
    figures: dict[str, str] = field(default_factory=dict)  # "queue|tenant|name" -> stated text
    images: dict[str, bytes] = field(default_factory=dict)  # queue -> PNG of its plots


def _note(ax, text: str) -> None:
    """A plot with nothing to draw: ``text`` in its place."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def _bars(ax, frame, columns, labels, scale: float = 1.0) -> None:
    """Grouped bars of ``columns`` per tenant of ``frame``."""
    xs = range(len(frame))
    for i, (col, label) in enumerate(zip(columns, labels)):
        ax.bar([x + (i - 1) * 0.27 for x in xs], frame[col] / scale, width=0.27, label=label)
    ax.set_xticks(list(xs), [tenant_label(t) for t in frame["tenant"]], fontsize=8)
    ax.legend(fontsize=8)


def _plots(queue: str, frames: dict) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    share, waits, fair, tput, errs, redel = (frames[k] for k in FRAMES[:6])
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    fig.suptitle(f"queue {queue}", fontsize=14)
    for ax in (axes[0][0], axes[0][2], axes[1][0]):  # plots over time
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)

    ax = axes[0][0]
    if len(share):
        pivot = share.pivot_table(index="window_start", columns="tenant", values="share", fill_value=0.0)
        ax.stackplot(
            pivot.index, *[pivot[c] for c in pivot.columns], labels=[tenant_label(c) for c in pivot.columns], alpha=0.85
        )
        ax.legend(loc="upper left", fontsize=8, ncol=2)
    ax.set_title("share of deliveries per window")
    ax.set_ylim(0, 1)

    ax = axes[0][1]
    w = waits[waits["wait_p50_ms"].notna()] if len(waits) else waits
    if len(w):
        _bars(ax, w, ("wait_p50_ms", "wait_p90_ms", "wait_p99_ms"), ("p50", "p90", "p99"), 1000.0)
    ax.set_title("wait to first delivery (s)")

    ax = axes[0][2]
    if len(fair):
        ax.plot(fair["window_start"], fair["jain"], marker=".", linewidth=1, label="all tenants")
        ax.plot(fair["window_start"], fair["jain_within_rank"], marker=".", linewidth=1, label="within a priority")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_ylim(0, 1.05)
    ax.set_title("Jain's fairness index per window")

    ax = axes[1][0]
    if len(tput):
        secs = (tput["acked"] / tput["acked_per_s"]).where(tput["acked"] > 0).dropna()
        window_s = float(secs.iloc[0]) if len(secs) else 1.0
        ax.plot(tput["window_start"], tput["enqueued"] / window_s, label="enqueued/s", linewidth=1)
        ax.plot(tput["window_start"], tput["acked_per_s"], label="acked/s", linewidth=1)
        ax.legend(fontsize=8)
    ax.set_title("throughput")

    ax = axes[1][1]
    if len(errs) and int(errs["rank_error"].max()) > 0:
        ax.hist(errs["rank_error"], bins=min(int(errs["rank_error"].max()) + 1, 50), log=True)
    elif len(errs):
        _note(ax, f"all {len(errs):,} deliveries: rank error 0\n(strict priority order)")
    ax.set_title("rank error of each delivery (entries that outranked it)")

    ax = axes[1][2]
    columns = ("redeliveries", "expired", "dead")
    if len(redel) and not redel[list(columns)].to_numpy().any():
        _note(ax, "no redeliveries, expired leases or dead letters")
    elif len(redel):
        _bars(ax, redel, columns, columns)
    ax.set_title("redeliveries, expired leases, dead letters")

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return buf.getvalue()


def _cell(figures, key, value, kind) -> str:
    text = fmt(value, kind)
    figures[key] = text
    return f'<td data-figure="{html.escape(key)}">{html.escape(text)}</td>'


def build_report(events, *, window_seconds: float | None = None) -> Report:
    from .analysis import analyze

    dfs = analyze(events, window_seconds=window_seconds)
    # pd.DataFrame: pyspark's PandasDataFrameLike does not resolve for mypy
    summary: pd.DataFrame = dfs["summary"].toPandas()
    report = Report("")
    parts = [f"<h1>{html.escape(TITLE)}</h1>"]
    if not len(summary):
        parts.append("<p>The event log is empty.</p>")
    all_frames: dict[str, pd.DataFrame] = {k: dfs[k].toPandas() for k in FRAMES}
    for _, q in summary.iterrows():
        queue = q["queue"]
        frames = {k: v[v["queue"] == queue].reset_index(drop=True) for k, v in all_frames.items()}
        png = report.images[queue] = _plots(queue, frames)
        rows = "".join(
            f"<tr><th>{html.escape(label)}</th>{_cell(report.figures, f'{queue}||{name}', q[name], kind)}</tr>"
            for name, label, kind in QUEUE_FIGURES
        )
        tenants = (
            frames["waits"]
            .merge(frames["redeliveries"].drop(columns=["deliveries"]), on=["queue", "tenant"], how="outer")
            .merge(frames["worker_time"], on=["queue", "tenant"], how="left")
        )  # (fair_cost="time": held_ms)
        head = "".join(f"<th>{html.escape(label)}</th>" for _, label, _ in TENANT_FIGURES)
        body = "".join(
            f"<tr><th>{html.escape(tenant_label(t['tenant']))}</th>"
            + "".join(
                _cell(report.figures, f"{queue}|{t['tenant']}|{name}", t.get(name), kind)
                for name, _, kind in TENANT_FIGURES
            )
            + "</tr>"
            for _, t in tenants.sort_values("tenant").iterrows()
        )
        parts.append(
            f"<h2>queue {html.escape(queue)}</h2>"
            f"<p>Time windows of {int(q['window_ms']) / 1000:g} s. Waits run from an entry becoming waiting "
            "(enqueue, or due for a delayed entry) to its first delivery. The rank error of a delivery counts the "
            "entries waiting at that moment with a strictly better rank.</p>"
            f'<img alt="plots of queue {html.escape(queue)}" src="data:image/png;base64,'
            f'{base64.b64encode(png).decode()}">'
            f"<h3>the queue</h3><table>{rows}</table>"
            f"<h3>per tenant</h3><table><tr><th>tenant</th>{head}</tr>{body}</table>"
        )
    report.html = (
        '<!DOCTYPE html><html><head><meta charset="utf-8">'
        f"<title>{html.escape(TITLE)}</title><style>"
        "body{font-family:sans-serif;margin:2em;max-width:1300px}"
        "table{border-collapse:collapse;margin:.5em 0 1.5em}"
        "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}"
        "th{background:#f4f4f4}img{max-width:100%}"
        "</style></head><body>" + "".join(parts) + "</body></html>\n"
    )
    return report


def write_report(source, html_path, *, png_path=None, spark=None, window_seconds: float | None = None) -> Report:
    """Read ``source`` (a Parquet path written by export-events, or an events DataFrame), write
    the HTML page to ``html_path`` and, if asked, the first queue's plots to ``png_path``."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"no event log at {str(path)!r}: export one with `celery -A proj pq export-events`")
        if path.is_dir() and not any(path.glob("*.parquet")):
            raise ValueError(f"{str(path)!r} holds no Parquet files: no events were exported to it yet")
        if spark is None:
            from ..session import local_spark

            spark = local_spark("celery-pq-report", shuffle_partitions=4)
        events = spark.read.parquet(str(path))
    else:
        events = source
    report = build_report(events, window_seconds=window_seconds)
    Path(html_path).write_text(report.html)
    if png_path is not None and report.images:
        Path(png_path).write_bytes(next(iter(report.images.values())))
    return report
