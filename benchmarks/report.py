"""Markdown summary and PNG plots of a benchmark run."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

_COLUMNS = [
    "workload",
    "system",
    "records/s",
    "MB/s",
    "ratio to baseline",
    "ack p50",
    "ack p99",
    "ack p99.9",
    "ack max",
    "e2e p50",
    "e2e p99",
    "errors",
]


def _fmt(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def write_report(doc: dict[str, Any], out: Path) -> None:
    m = doc["machine"]
    lines = [
        f"# Tidegate benchmarks ({doc['mode']} mode)",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, {m['os']}, "
        f"Python {m['python']}; commit {m['commit']}, {m['date']}; "
        f"suite took {doc['elapsed_s']} s.",
        "",
        "Latency is measured from each request's intended send time (open loop; closed-loop "
        "workloads measure capacity). Every Tidegate row is compared with its baseline measured "
        "in the same run on the same machine.",
        "",
        "| " + " | ".join(_COLUMNS) + " |",
        "|---|---|" + "---:|" * (len(_COLUMNS) - 2),
    ]
    for r in doc["results"]:
        a = r["ack_latency"] or {}
        e = r["e2e_latency"] or {}
        cells = [
            r["workload"],
            r["system"],
            f"{r['records_per_s']:.0f}",
            f"{r['mb_per_s']:.1f}",
            _fmt(r.get("throughput_ratio")),
            *(_fmt(a.get(k)) for k in ("p50_ms", "p99_ms", "p999_ms", "max_ms")),
            *(_fmt(e.get(k)) for k in ("p50_ms", "p99_ms")),
            str(r["errors"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Latencies in milliseconds. ![throughput](throughput.png) ![latency](latency.png)")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    _plots(doc, out)


def _plots(doc: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_workload: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in doc["results"]:
        by_workload[r["workload"]].append(r)
    workloads = list(by_workload)

    fig, ax = plt.subplots(figsize=(9, 4.5))
    systems = sorted({r["system"] for r in doc["results"]})
    width = 0.8 / max(1, len(systems))
    for i, system in enumerate(systems):
        vals = [
            next((r["mb_per_s"] for r in by_workload[w] if r["system"] == system), 0)
            for w in workloads
        ]
        ax.bar([x + i * width for x in range(len(workloads))], vals, width, label=system)
    ax.set_xticks([x + width * (len(systems) - 1) / 2 for x in range(len(workloads))], workloads)
    ax.set_ylabel("MB/s")
    ax.set_title("Append throughput")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(workloads), figsize=(4.5 * len(workloads), 4), squeeze=False)
    pcts = ["p50_ms", "p99_ms", "p999_ms", "max_ms"]
    for ax, w in zip(axes[0], workloads, strict=True):
        for r in by_workload[w]:
            a = r["ack_latency"]
            if a:
                ax.plot(
                    ["p50", "p99", "p99.9", "max"],
                    [a[p] for p in pcts],
                    marker="o",
                    label=r["system"],
                )
        ax.set_yscale("log")
        ax.set_title(f"{w}: ack latency")
        ax.set_ylabel("ms")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=110)
    plt.close(fig)
