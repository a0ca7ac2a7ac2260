"""The benchmarks' common table: one row per figure, with the product's value, its baseline measured in the
same run, their ratio and the target (docs/benchmark.md: Benchmark).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    """One row: ``product`` and ``baseline`` in ``unit``; ``ratio`` is product / baseline unless given."""

    name: str
    product: float
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    target: str = ""

    @property
    def ratio(self) -> float | None:
        return None if not self.baseline else self.product / self.baseline


def percentile(values: list[float], fraction: float) -> float:
    """The ``fraction`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def median(values: list[float]) -> float:
    return statistics.median(values)


def print_table(figures: list[Figure]) -> None:
    """Print ``figures`` as one Markdown table."""
    print("| figure | product | baseline | ratio | target |")
    print("|---|---|---|---|---|")
    for figure in figures:
        baseline = "" if figure.baseline is None else f"{figure.baseline:,.1f} {figure.unit} ({figure.baseline_name})"
        ratio = "" if figure.ratio is None else f"{figure.ratio:.2f}"
        print(f"| {figure.name} | {figure.product:,.1f} {figure.unit} | {baseline} | {ratio} | {figure.target} |")
