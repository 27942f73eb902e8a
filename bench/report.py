"""The benchmark harness' shared shapes: one figure, the context every suite runs in, and
the report (`bench/report.json` and the printed table).

A figure is one number measured beside its baseline in the same run. `ratio` is above 1
when livepush wins, whichever way the figure runs: for a rate it is value / baseline, for a
latency or a cost it is baseline / value. With `bin/bench --repeat N` every figure is the
median over N runs, and its ratio the median of the N ratios, each paired within its run.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import statistics
import sys
from collections.abc import Iterable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Figure:
    """One measured figure of livepush and its baseline's, from the same run."""

    name: str
    value: float
    unit: str
    baseline: str | None = None
    baseline_value: float | None = None
    higher_is_better: bool = True
    suite: str = ""
    goal: float | None = None  # the ratio an issue or a guarantee asks for, if any
    # With `--repeat`: each run's ratio, livepush against its baseline of that same run.
    ratios: tuple[float, ...] = ()

    @property
    def ratio(self) -> float | None:
        if self.ratios:
            # The median of paired ratios, not a ratio of medians: a slow minute then weighs on
            # both sides of the pair it fell on, and on no other.
            return statistics.median(self.ratios)
        if self.baseline_value is None or not self.value or not self.baseline_value:
            return None
        r = self.value / self.baseline_value if self.higher_is_better else self.baseline_value / self.value
        return r if math.isfinite(r) else None

    @property
    def met(self) -> int | None:
        """In how many of the runs the ratio reached the goal (with `ratios` and a goal)."""
        if self.goal is None or not self.ratios:
            return None
        return sum(r >= self.goal for r in self.ratios)

    def as_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["ratio"] = None if self.ratio is None else round(self.ratio, 3)
        out["ratios"] = [round(r, 3) for r in self.ratios]
        return out


def combine(runs: list[list[Figure]]) -> list[Figure]:
    """One figure per suite, name and baseline over repeated runs of the harness: the median
    value, the median baseline value, and each run's own ratio (the figure's ratio is their
    median). A figure a run did not produce (its suite failed there) is combined over the runs
    that did."""
    by_key: dict[tuple[str, str, str | None], list[Figure]] = {}
    for run in runs:
        for f in run:
            by_key.setdefault((f.suite, f.name, f.baseline), []).append(f)
    out = []
    for same in by_key.values():
        baselines = [f.baseline_value for f in same if f.baseline_value is not None]
        ratios = tuple(r for r in (f.ratio for f in same) if r is not None)
        out.append(dataclasses.replace(
            same[0], value=statistics.median(f.value for f in same),
            baseline_value=statistics.median(baselines) if baselines else None, ratios=ratios,
        ))
    return out


@dataclasses.dataclass
class Context:
    """What every suite is given: the services the harness started, and how long to run."""

    pg_admin_url: str  # a superuser URL; suites make scratch databases on this server
    redis_url: str
    quick: bool  # the whole harness under 3 minutes instead of 13 to 27 (bench/README.md)
    workdir: str  # a scratch directory for logs and sockets, removed at the end
    bench_python: str | None  # the bench-only virtualenv's python (competitors), if present


class Rounds:
    """Each system's samples of each key over a suite's rounds; a figure is their median."""

    def __init__(self) -> None:
        self.samples: dict[tuple[str, str], list[float]] = collections.defaultdict(list)

    def add(self, system: str, got: dict[str, float | list[float]]) -> None:
        for key, value in got.items():
            self.samples[system, key].extend(value if isinstance(value, list) else [value])

    def median(self, system: str, key: str) -> float | None:
        values = self.samples.get((system, key))
        return statistics.median(values) if values else None


def note(text: str) -> None:
    """A progress line: on stderr, so stdout carries the header and the table only."""
    print(text, file=sys.stderr, flush=True)


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        text = f"{value:,.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.3g}"
    return f"{text} {unit}".rstrip()


def table(figures: Iterable[Figure]) -> str:
    """The figures as one aligned plain-text table, in the order given."""
    figures = list(figures)
    repeated = any(len(f.ratios) > 1 for f in figures)
    rows = [("suite", "figure", "livepush", "baseline", "baseline value", "ratio", "goal")
            + (("runs' ratios", "met") if repeated else ())]
    for f in figures:
        row = (
            f.suite, f.name, fmt(f.value, f.unit), f.baseline or "-", fmt(f.baseline_value, f.unit),
            "-" if f.ratio is None else f"{f.ratio:.2f}x", "-" if f.goal is None else f">= {f.goal:.2f}".rstrip("0").rstrip(".") + "x",
        )
        if repeated:
            spread = f"{min(f.ratios):.2f}-{max(f.ratios):.2f}x" if f.ratios else "-"
            row += (spread, "-" if f.met is None else f"{f.met}/{len(f.ratios)}")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def write(path: str, figures: Iterable[Figure]) -> None:
    """Writes the report: a JSON list of every figure (the machine and command go in the
    printed header and docs/performance.md)."""
    with open(path, "w") as fh:
        json.dump([f.as_json() for f in figures], fh, indent=2)
        fh.write("\n")
