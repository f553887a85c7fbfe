"""Issue 32, item 12: the benchmark report's figures say what each workload measured, in
its own unit, without matplotlib warnings (warnings are errors here), and the profile's
summary of an empty recording says so instead of printing empty sections."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.profile import summarise
from benchmarks.report import panel, throughput_figure
from tests.services import REPO_ROOT


def _by_workload() -> dict[str, list[dict[str, object]]]:
    doc = json.loads((REPO_ROOT / "benchmarks" / "results" / "results.json").read_text())
    out: dict[str, list[dict[str, object]]] = {}
    for r in doc["results"]:
        out.setdefault(r["workload"], []).append(r)
    return out


def test_each_panel_is_in_its_workloads_unit() -> None:
    by = _by_workload()
    labels, values, _, unit = panel(by["shards-rebalance"])  # type: ignore[arg-type]
    assert unit == "max/mean shard load (1 = even)"
    assert values[0] > values[1] > 0 and labels[0].startswith("before")
    _, values, _, unit = panel(by["shards-move"])  # type: ignore[arg-type]
    assert unit == "seconds per move (lower is better)" and all(v > 0 for v in values)
    assert panel(by["shards-append"])[3] == "records/s"  # type: ignore[arg-type]


def test_the_throughput_figure_keeps_its_title_clear(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = throughput_figure(_by_workload(), plt)  # type: ignore[arg-type]
    fig.savefig(tmp_path / "throughput.png", dpi=60)  # draws: any layout warning fails
    renderer = fig.canvas.get_renderer()
    title = fig._suptitle.get_window_extent(renderer)  # matplotlib keeps it private
    for ax in fig.axes:
        if ax.axison:
            assert not title.overlaps(ax.get_tightbbox(renderer)), ax.get_title()
    plt.close(fig)


def test_an_empty_profile_says_it_is_empty(tmp_path: Path) -> None:
    raw = tmp_path / "samples.txt"
    raw.write_text("")
    text = summarise(raw, ["gateway.server.calls:read"])
    assert text.startswith("samples: 0 (py-spy recorded nothing")
    assert "functions by their own samples" not in text
    raw.write_text("main (a.py:1);read (b.py:2) 3\nmain (a.py:1) 1\n")
    full = summarise(raw, ["read"])
    assert "75.0%  read" in full and "samples: 4" in full
