"""What every benchmark shares: the JSON line of a figure, percentiles, resident memory, and a private
local environment (deploy/localenv) brought up in a temporary state directory and torn down afterwards.

Every figure is printed next to a baseline measured in the same run, because absolute times on a shared
2-core machine are noise; the ratio is what can be compared between runs."""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from deploy.localenv.env import EnvState, down, up


def figure_line(
    name: str, value: float, unit: str, *, baseline: float | None, params: dict[str, Any] | None = None
) -> str:
    """One figure as a JSON line; `ratio` is value / baseline (None without a usable baseline)."""
    ratio = None if baseline is None or baseline == 0 else round(value / baseline, 3)
    return json.dumps(
        {"name": name, "value": _round(value), "unit": unit, "baseline": _round(baseline), "ratio": ratio,
         "params": params or {}},
        sort_keys=False,
    )  # fmt: skip


def emit(name: str, value: float, unit: str, *, baseline: float | None, params: dict[str, Any] | None = None) -> None:
    print(figure_line(name, value, unit, baseline=baseline, params=params), flush=True)


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 4)


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0–100) with linear interpolation between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile p must be between 0 and 100, got {p}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def rss_mb(pid: int | None = None) -> float:
    """Resident memory of a process (this one by default), from /proc, in MiB."""
    for line in Path(f"/proc/{pid or os.getpid()}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def log(message: str) -> None:
    """Progress goes to stderr, so that stdout holds only the JSON lines."""
    print(message, file=sys.stderr, flush=True)


@contextmanager
def local_env(clusters: list[str], *, dynamic_config: dict[str, str] | None = None) -> Iterator[EnvState]:
    """A Temporal dev server (in memory) and `clusters`, in a temporary state directory, for one benchmark."""
    state_dir = Path(tempfile.mkdtemp(prefix="tidepool-bench-"))
    log(f"starting Temporal and clusters {', '.join(clusters)} in {state_dir}")
    try:
        yield up(clusters=clusters, state_dir=state_dir, persistent=False, dynamic_config=dynamic_config)
    finally:
        log("tearing the environment down")
        down(state_dir)  # also removes the state directory
