"""Markdown summary and PNG plots of a benchmark run."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

_COLUMNS = [
    "workload",
    "system",
    "records/s",
    "MB/s",
    "ratio to baseline",
    "ratio to pass-through",
    "ack p50",
    "ack p99",
    "ack p99.9",
    "ack max",
    "e2e p50",
    "e2e p99",
    "errors",
    "notes",
]


def _fmt(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


#: What names a pass-through baseline (``benchmarks.passthrough``): its ratio has a
#: column of its own, so a row says apart what is Tidegate's and what is the edge's.
PASS_THROUGH = "pass-through"


def _ratios(r: dict[str, Any], through: bool = False) -> str:
    """The row's ratios to its raw-store baselines, or (``through``) to its pass-through."""
    parts = [
        f"{v:.2f}x {k.removesuffix(' (baseline)')}"
        for k, v in (r.get("ratios") or {}).items()
        if v is not None and k.startswith(PASS_THROUGH) == through
    ]
    return "; ".join(parts) or "-"


def _notes(r: dict[str, Any]) -> str:
    notes = []
    if r.get("p99_vs_alone") is not None:
        if r.get("runs", 1) > 1 and r.get("p99_ratio_min") is not None:
            notes.append(
                f"p99 {r['p99_vs_alone']:.2f}x B alone (median of {r['runs']} runs; "
                f"{r['p99_ratio_min']:.2f}x to {r['p99_ratio_max']:.2f}x)"
            )
        else:
            notes.append(f"p99 {r['p99_vs_alone']:.2f}x B alone")
    if r.get("gateway_cpu") is not None:
        notes.append(f"gateway CPU {r['gateway_cpu']:.0%} of a core")
    if r.get("load_avg_1m") is not None:
        notes.append(f"machine load {r['load_avg_1m']:.1f}")
    if r.get("quota_mb_per_s") is not None:
        notes.append(
            f"offered {r['offered_mb_per_s']:.1f} MB/s, quota {r['quota_mb_per_s']:.1f} MB/s"
        )
    if r.get("data_files") is not None:
        notes.append(f"{r['data_files']} data files")
    if r.get("tier_every_s") is not None:
        notes.append(f"e2e = append → in an Iceberg snapshot, job every {r['tier_every_s']:g} s")
    if r.get("tiered_share"):
        notes.append(
            f"{r['tiered_share']:.0%} of the records were tiered by the gateway's embedded "
            "schedule during the run and read from Iceberg"
        )
    if r.get("settled_with_backlog") is not None:
        notes.append(f"from a settled group with {r['settled_with_backlog']:,} records to read")
    if r.get("rebalance_s") is not None:
        note = f"rebalanced in {r['rebalance_s']:.2f} s"
        if r.get("session_timeout_s") is not None:
            note += f", of which the {r['session_timeout_s']:g} s session timeout"
        notes.append(note)
    if r.get("retries"):
        notes.append(f"{r['retries']} retried batches")
    return "; ".join(notes)


def write_report(doc: dict[str, Any], out: Path) -> None:
    m = doc["machine"]
    lines = [
        f"# Tidegate benchmarks ({doc['mode']} mode)",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, {m['os']}, "
        f"Python {m['python']}; commit {m['commit']}, {m['date']}; "
        f"suite took {doc['elapsed_s']} s."
        + (
            " Gateway settings changed from the defaults: "
            + ", ".join(f"`{k}={v}`" for k, v in doc["gateway_env"].items())
            + "."
            if doc.get("gateway_env")
            else ""
        ),
        "",
        "Every Tidegate row is compared with the baselines of its workload, measured in the "
        "same run on the same machine. *Ratio* is Tidegate's records/s divided by the "
        "baseline's (1.00 = as fast; the records are the same on both sides). *Ratio to "
        "pass-through* divides by the pass-through of the same tier: the same gRPC edge "
        "and clients over the same raw store with no Tidegate logic (benchmarks/passthrough.py);"
        " below 1.00 is Tidegate's own cost, the pass-through's ratio to the raw store is the "
        "edge's. Open-loop "
        "workloads measure latency from each request's intended send time, so stalls are "
        "not hidden; closed-loop workloads measure capacity, and their latency is per call "
        "at that capacity. Latencies in milliseconds.",
        "",
        "| " + " | ".join(_COLUMNS) + " |",
        "|---|---|" + "---:|" * (len(_COLUMNS) - 3) + "---|",
    ]
    for r in doc["results"]:
        a = r["ack_latency"] or {}
        e = r["e2e_latency"] or {}
        cells = [
            r["workload"],
            r["system"],
            f"{r['records_per_s']:.0f}",
            f"{r['mb_per_s']:.1f}",
            _ratios(r),
            _ratios(r, through=True),
            *(_fmt(a.get(k)) for k in ("p50_ms", "p99_ms", "p999_ms", "max_ms")),
            *(_fmt(e.get(k)) for k in ("p50_ms", "p99_ms")),
            str(r["errors"]),
            _notes(r),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "![throughput](throughput.png)", "", "![latency](latency.png)"]
    if any(r.get("data_files") for r in doc["results"]):
        lines += ["", "![read cost against table size](read-cost.png)"]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    _plots(doc, out)


def _grid(n: int) -> tuple[int, int]:
    cols = min(3, max(1, n))
    return math.ceil(n / cols), cols


BASELINE, OURS = "#9aa", "#2a7"


def panel(rs: list[dict[str, Any]]) -> tuple[list[str], list[float], list[str], str]:
    """A throughput panel's bars (labels, values, colours) and their unit, from what the
    workload measured: a move's seconds, a rebalance's max/mean shard load before and
    after, or records/s."""

    def colour(r: dict[str, Any]) -> str:
        return BASELINE if "baseline" in r["system"] else OURS

    if any("max_mean_before" in r for r in rs):
        labels, values, colours = [], [], []
        for r in rs:
            labels += [f"before: {r['system'][:30]}", f"after: {r['system'][:30]}"]
            values += [r["max_mean_before"], r["max_mean_after"]]
            colours += [BASELINE, OURS]
        return labels, values, colours, "max/mean shard load (1 = even)"
    if any("move_s" in r for r in rs):
        return (
            [r["system"][:38] for r in rs],
            [r["move_s"] for r in rs],
            [colour(r) for r in rs],
            "seconds per move (lower is better)",
        )
    return (
        [r["system"][:38] for r in rs],
        [r["records_per_s"] for r in rs],
        [colour(r) for r in rs],
        "records/s",
    )


def throughput_figure(by_workload: dict[str, list[dict[str, Any]]], plt: Any) -> Any:
    """One panel per workload, a bar per system, in the unit the workload measures
    (:func:`panel`); the layout keeps the title clear of the first row."""
    from matplotlib.ticker import EngFormatter

    workloads = list(by_workload)
    rows, cols = _grid(len(workloads))
    fig, axes = plt.subplots(
        rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False, layout="constrained"
    )
    for ax, w in zip(axes.flat, workloads, strict=False):
        labels, values, colours, unit = panel(by_workload[w])
        ax.barh(range(len(values)), values, color=colours)
        ax.set_yticks(range(len(values)), labels, fontsize=6)
        ax.invert_yaxis()
        ax.set_title(w, fontsize=8)
        ax.set_xlabel(unit, fontsize=7)
        if unit == "records/s":
            ax.xaxis.set_major_formatter(EngFormatter())
        ax.tick_params(axis="x", labelsize=6)
    for ax in list(axes.flat)[len(workloads) :]:
        ax.axis("off")
    fig.suptitle("Throughput (grey: baseline)")
    return fig


def _plots(doc: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_workload: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in doc["results"]:
        by_workload[r["workload"]].append(r)
    workloads = list(by_workload)
    rows, cols = _grid(len(workloads))

    fig = throughput_figure(by_workload, plt)
    fig.savefig(out / "throughput.png", dpi=110)
    plt.close(fig)

    # Latency percentiles: one panel per workload, a line per system.
    fig, axes = plt.subplots(
        rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False, layout="constrained"
    )
    pcts = ["p50_ms", "p99_ms", "p999_ms", "max_ms"]
    for ax, w in zip(axes.flat, workloads, strict=False):
        for r in by_workload[w]:
            lat = r["e2e_latency"] if r.get("tier_every_s") else r["ack_latency"]
            if lat:
                ax.plot(
                    ["p50", "p99", "p99.9", "max"],
                    [max(lat[p], 1e-3) for p in pcts],
                    marker="o",
                    label=r["system"][:38],
                )
        ax.set_yscale("log")
        ax.set_title(w, fontsize=8)
        ax.set_ylabel("ms", fontsize=7)
        ax.tick_params(labelsize=6)
        if ax.get_legend_handles_labels()[0]:  # a workload without latencies has none
            ax.legend(fontsize=5)
    for ax in list(axes.flat)[len(workloads) :]:
        ax.axis("off")
    fig.suptitle("Latency percentiles (acknowledgement; freshness: append → in Iceberg)")
    fig.savefig(out / "latency.png", dpi=110)
    plt.close(fig)

    _read_cost_plot(doc, out, plt)


def _read_cost_plot(doc: dict[str, Any], out: Path, plt: Any) -> None:
    """p50 and p99 of one read against the table's number of data files, per system."""
    by_system: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for r in doc["results"]:
        if r.get("data_files") and r["ack_latency"]:
            a = r["ack_latency"]
            by_system[r["system"]].append((r["data_files"], a["p50_ms"], a["p99_ms"]))
    if not by_system:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for system, points in by_system.items():
        points.sort()
        (line,) = ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=system)
        ax.plot([p[0] for p in points], [p[2] for p in points], ls="--", color=line.get_color())
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("data files in the table")
    ax.set_ylabel("ms per read (solid p50, dashed p99)")
    ax.set_title("Cost of one 1,000-record read against table size")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "read-cost.png", dpi=110)
    plt.close(fig)
