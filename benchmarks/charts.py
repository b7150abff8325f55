"""PNG charts for ``BENCHMARKS.md``: a reader should see a result without reading numbers.

Two shapes cover every figure: ``distribution`` (box plots of samples per series, e.g.
lateness of shardjob beside APScheduler) and ``bars`` (grouped bars of one value per series
and group, e.g. round trips per fire at 1/100/10,000 items, ours beside ElasticJob's).

Invariants: matplotlib is a benchmark-only dependency (the ``bench`` extra), imported here
and only when a chart is drawn, with the non-interactive Agg backend (CI has no screen);
every chart is written under the directory it is given and its path returned relative to
the report, so the markdown links stay valid wherever the repository is checked out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["Charts"]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


class Charts:
    """Draws into ``directory``; links are relative to ``relative_to`` (the report's folder)."""

    def __init__(self, directory: Path, relative_to: Path) -> None:
        self.directory = directory
        self.relative_to = relative_to

    def _save(self, figure: Any, name: str) -> str:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{name}.png"
        figure.tight_layout()
        figure.savefig(path, dpi=110)
        _pyplot().close(figure)
        return path.relative_to(self.relative_to).as_posix()

    def distribution(
        self,
        name: str,
        title: str,
        series: Mapping[str, Sequence[float]],
        unit: str,
        *,
        log_scale: bool = False,
        reference: tuple[float, str] | None = None,
    ) -> str:
        """Box plots (whiskers at the 1st and 99th percentiles) of each series' samples;
        ``reference`` draws a labelled horizontal line (e.g. a target). Returns the link."""
        plt = _pyplot()
        labels = [label for label, values in series.items() if values]
        figure, axes = plt.subplots(figsize=(max(4.0, 1.6 * len(labels) + 2), 3.6))
        axes.boxplot([list(series[label]) for label in labels], whis=(1, 99), showfliers=True)
        axes.set_xticks(range(1, len(labels) + 1), labels)
        axes.set_title(title)
        axes.set_ylabel(unit)
        if log_scale:
            axes.set_yscale("log")
        if reference is not None:
            axes.axhline(reference[0], color="tab:red", linestyle="--", linewidth=1)
            axes.annotate(reference[1], (0.5, reference[0]), color="tab:red", fontsize=8, va="bottom")
        axes.grid(axis="y", alpha=0.3)
        return self._save(figure, name)

    def bars(
        self,
        name: str,
        title: str,
        groups: Mapping[str, Mapping[str, float]],
        unit: str,
        *,
        log_scale: bool = False,
    ) -> str:
        """Grouped bars: one group per key of ``groups`` (e.g. '100 items'), one bar per
        series inside it (e.g. 'shardjob', 'ElasticJob'). Returns the link."""
        plt = _pyplot()
        group_names = list(groups)
        series_names: list[str] = []
        for values in groups.values():
            series_names += [s for s in values if s not in series_names]
        width = 0.8 / max(1, len(series_names))
        figure, axes = plt.subplots(
            figsize=(max(4.0, 1.3 * len(group_names) * max(1, len(series_names)) / 2 + 2), 3.6)
        )
        for index, series in enumerate(series_names):
            xs = [g + index * width - 0.4 + width / 2 for g in range(len(group_names))]
            ys = [groups[group].get(series, 0.0) for group in group_names]
            bars = axes.bar(xs, ys, width, label=series)
            axes.bar_label(bars, fmt="%.3g", fontsize=7)
        axes.set_xticks(range(len(group_names)), group_names)
        axes.set_title(title)
        axes.set_ylabel(unit)
        if log_scale:
            axes.set_yscale("log")
        axes.legend(fontsize=8)
        axes.grid(axis="y", alpha=0.3)
        return self._save(figure, name)
