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
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from kubernetes import client as k8s

from deploy.localenv.env import EnvState, down, up
from kube.informer import Informer
from models.names import ADVERTISEMENTS, GROUP, VERSION


def figure_line(
    name: str, value: float, unit: str, *, baseline: float | None, params: dict[str, Any] | None = None
) -> str:
    """One figure as a JSON line; `ratio` is value / baseline (None without a usable baseline: none, zero or a
    miss). A figure is a number or a miss (infinite), never NaN: a NaN is refused, loudly."""
    if math.isnan(value) or (baseline is not None and math.isnan(baseline)):
        raise ValueError(f"figure {name} is NaN (value {value}, baseline {baseline}): a figure is a number or a miss")
    ratio = None if baseline is None or baseline == 0 or math.isinf(baseline) else float(f"{value / baseline:.4g}")
    return json.dumps(
        {"name": name, "value": _round(value), "unit": unit, "baseline": _round(baseline), "ratio": ratio,
         "params": params or {}},
        ensure_ascii=False,
    )  # fmt: skip


# Where figures go: `python -m bench` points this at the original stdout and sends everything else
# written to stdout (the Temporal core's own log lines among them) to stderr.
figures_out: TextIO | None = None


def emit(name: str, value: float, unit: str, *, baseline: float | None, params: dict[str, Any] | None = None) -> None:
    print(figure_line(name, value, unit, baseline=baseline, params=params), file=figures_out or sys.stdout, flush=True)


def _round(value: float | None) -> float | None:
    """Four significant digits: more is noise on a shared machine."""
    return None if value is None else float(f"{float(value):.4g}")


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0–100) with linear interpolation between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile p must be between 0 and 100, got {p}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low, high = math.floor(rank), math.ceil(rank)
    if math.isinf(ordered[high]):  # a miss above the rank makes it infinite, not NaN
        return ordered[low] if rank == low else math.inf
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def rss_mb(pid: int | None = None, *, field: str = "VmRSS") -> float:
    """Resident memory of a process (this one by default), from /proc, in MiB: now (VmRSS) or its peak (VmHWM)."""
    for line in Path(f"/proc/{pid or os.getpid()}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for process {pid}")


def cpu_seconds(pid: int | None = None, *, thread: threading.Thread | None = None) -> float:
    """CPU time (user + system) a process (this one by default), or one of this process's threads, has used,
    from /proc, in seconds."""
    stat = Path(f"/proc/self/task/{thread.native_id}/stat" if thread else f"/proc/{pid or os.getpid()}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def watching_cpu_seconds() -> float:
    """CPU time the threads that carry this process's watches have used: the streams' loop and the
    informers' handlers (kube/informer.py), in seconds."""
    return sum(cpu_seconds(thread=t) for t in threading.enumerate()
               if t.name == "kube-streams" or t.name.startswith("informer-handler"))  # fmt: skip


def log(message: str) -> None:
    """Progress goes to stderr, so that stdout holds only the JSON lines."""
    print(message, file=sys.stderr, flush=True)


@contextmanager
def local_env(clusters: list[str], *, dynamic_config: dict[str, str] | None = None,
              without_node_lifecycle: Collection[str] = ()) -> Iterator[EnvState]:  # fmt: skip
    """A Temporal dev server (in memory) and `clusters`, in a temporary state directory, for one benchmark;
    torn down afterwards, or as far as it came up (`up` retries a cluster that fails to start)."""
    state_dir = Path(tempfile.mkdtemp(prefix="tidepool-bench-"))
    log(f"starting Temporal and clusters {', '.join(clusters)} in {state_dir}")
    try:
        yield up(clusters=clusters, state_dir=state_dir, persistent=False, dynamic_config=dynamic_config,
                 without_node_lifecycle=without_node_lifecycle)
    finally:
        log("tearing the environment down")
        down(state_dir)  # also removes the state directory


class AdvertisementWatch:
    """Follows the Advertisements on a foreign cluster with the product's informer and records when each
    version of one arrived (perf_counter) and the cpu it advertises, for latency measurements."""

    def __init__(self, foreign: k8s.ApiClient, name: str) -> None:
        self.name = name
        self.seen: list[tuple[float, str | None]] = []
        self._changed = threading.Condition()
        custom = k8s.CustomObjectsApi(foreign)
        self._informer = Informer(
            f"advertisements-{name}", custom.list_cluster_custom_object, on_sync=self._sync, on_event=self._event,
            group=GROUP, version=VERSION, plural=ADVERTISEMENTS,
        )  # fmt: skip

    def __enter__(self) -> AdvertisementWatch:
        self._informer.start()
        self._informer.wait_synced(60)
        return self

    def __exit__(self, *exc: object) -> None:
        self._informer.stop()

    def _record(self, obj: dict[str, Any]) -> None:
        if obj.get("metadata", {}).get("name") != self.name:
            return
        cpu = ((obj.get("spec") or {}).get("resourceQuota") or {}).get("hard", {}).get("cpu")
        with self._changed:
            self.seen.append((time.perf_counter(), cpu))
            self._changed.notify_all()

    def _sync(self, objs: list[dict[str, Any]]) -> None:
        for obj in objs:
            self._record(obj)

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind != "DELETED":
            self._record(obj)

    def wait_for(self, cpu: str, *, after: float, timeout: float = 60) -> float:
        """The perf_counter time at which a version advertising `cpu` arrived after `after`."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for at, seen in reversed(self.seen):
                    if at < after:
                        break
                    if seen == cpu:
                        return at
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no Advertisement {self.name} with cpu {cpu} within {timeout} s")
                self._changed.wait(left)
