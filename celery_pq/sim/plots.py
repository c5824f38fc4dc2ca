"""The sweep's figures (matplotlib, Agg): one PNG per panel, named ``relaxed-<panel>.png``."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")

#: {(column, legend): plot style} of the panels of percentiles, and of the lag panel
PERCENTILES = {(p, p): {"ls": ls, "marker": "o", "ms": 3} for p, ls in (("p50", "-"), ("p90", "--"), ("p99", ":"))}
MEAN_MEDIAN = {("mean", "mean"): {"marker": "o"}, ("p50", "median"): {"marker": ".", "ls": "--"}}


def figures(results: list[dict], img_dir: Path) -> list[Path]:
    """Draw every panel present in ``results`` into ``img_dir``; the paths written."""
    import matplotlib.pyplot as plt

    img_dir.mkdir(parents=True, exist_ok=True)
    by_panel: dict[str, list[dict]] = {}
    for r in results:
        by_panel.setdefault(r["panel"], []).append(r)
    paths = []
    for panel, draw in DRAW.items():
        rows = by_panel.get(panel)
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
        draw(ax, rows)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = img_dir / f"relaxed-{panel}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


def _distribution(ax, rows):
    r = rows[0]
    counts = r["histogram"]
    total = sum(counts)
    ax.bar(
        range(len(counts) - 1),
        [c / total for c in counts[:-1]],
        width=1.0,
        label=f"{r['nodes']} nodes, {r['peeks']} peeks, lag {r['lag']:,}",
    )
    ax.axhline(r["peeks"] / r["nodes"], color="k", lw=0.8, ls="--", label="k/n (P(0) in theory)")
    ax.set(
        xlabel=f"rank error (PEI); {counts[-1] / total:.1%} of pops are >= {len(counts) - 1}",
        ylabel="share of pops",
        title="Distribution of the rank error",
    )


def _series(x, group, label, xlabel, title, yscale="log", xscale="linear", base2=False, lines=PERCENTILES):
    """A panel: ``lines`` ({(column, legend): plot style}) against ``x``, one colour for each value of ``group``."""

    def draw(ax, rows):
        for g in dict.fromkeys(r[group] for r in rows):
            mine = sorted((r for r in rows if r[group] == g), key=lambda r: r[x])
            color = None
            for (column, legend), style in lines.items():
                (line,) = ax.plot(
                    [r[x] for r in mine], [r[column] for r in mine], color=color, label=f"{label(g)} {legend}", **style
                )
                color = line.get_color()
        ax.set(xscale=xscale, yscale=yscale, xlabel=xlabel, ylabel="rank error", title=title.format(**rows[0]))
        if base2:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))

    return draw


def _multiqueue(ax, rows):
    rows = sorted(rows, key=lambda r: r["nodes"])
    ax.plot([r["nodes"] for r in rows], [r["theory_mean"] for r in rows], "k-", label="(5/6)n - 1 + 1/(6n)")
    ax.plot([r["nodes"] for r in rows], [r["mean"] for r in rows], "o", label="simulated mean")
    ax.set(xlabel="nodes", ylabel="mean rank error", title="MultiQueue: simulation and closed form")


DRAW = {
    "distribution": _distribution,
    "lag": _series(
        "lag",
        "policy",
        str,
        "consumer lag (entries waiting)",
        "Strategies against the lag ({nodes} nodes, {peeks} peeks)",
        xscale="log",
        lines=MEAN_MEDIAN,
    ),
    "nodes": _series(
        "nodes", "peeks", "k={}".format, "nodes (subqueues)", "Rank error against the nodes (lag {lag:,})", "linear"
    ),
    "peeks": _series(
        "peeks", "nodes", "{} nodes".format, "peeks before the pop", "Rank error against the peeks (lag {lag:,})"
    ),
    "concurrency": _series(
        "consumers",
        "second_best",
        lambda on: "second-best" if on else "best only",
        "consumers popping at once",
        "Stale peeks ({nodes} nodes, {peeks} peeks, lag {lag:,})",
        base2=True,
    ),
    "multiqueue": _multiqueue,
}
