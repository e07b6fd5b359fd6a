"""tidepool's own Prometheus series. They are recorded through the Temporal SDK's metric meter, so one
endpoint per process (bound by workers/metrics.py) serves them next to the SDK's own: activities record
through `activity.metric_meter()` (which adds namespace, task_queue and activity_type), the thread-based
programs (virtual kubelet) through their runtime's meter. Each series is recorded where its fact is
known: a push and its latency in the push activity, a decision where the admission pass writes it, a
placement where the pool pass writes it, reflected pods in the virtual kubelet's pass.

The names are the metrics table of docs/operations.md; tests/test_metrics.py scrapes them."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal, get_args

from temporalio import activity
from temporalio.common import MetricMeter

from models.pool.health import HealthState
from models.resources import Resources

ADVERTISED_CPU = "tidepool_advertised_cpu_cores"
ADVERTISED_MEMORY = "tidepool_advertised_memory_bytes"
PUSHES = "tidepool_pushes"
PUSH_LATENCY = "tidepool_push_latency"
ACCEPTANCE_DECISIONS = "tidepool_acceptance_decisions"
PLACEMENTS = "tidepool_placements"
PLACEMENT_FAILURES = "tidepool_placement_failures"
REFLECTED_PODS = "tidepool_reflected_pods"
SUPER_CLUSTER_HEALTH = "tidepool_super_cluster_health"

# Milliseconds: a push is two API server round trips plus a token request.
PUSH_LATENCY_BUCKETS_MS = (10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0, 60000.0)
HISTOGRAM_BUCKETS = {PUSH_LATENCY: PUSH_LATENCY_BUCKETS_MS}


class Metrics:
    """tidepool's instruments on one meter; cheap to build (the SDK keeps one instrument per name)."""

    def __init__(self, meter: MetricMeter) -> None:
        self._meter = meter

    @classmethod
    def of_activity(cls) -> Metrics:
        """The running activity's meter; a no-op outside one (an activity method called directly)."""
        return cls(activity.metric_meter() if activity.in_activity() else MetricMeter.noop)

    def pushed(self, *, foreign_cluster: str, outcome: Literal["ok", "failed"], latency: timedelta) -> None:
        attributes = {"foreign_cluster": foreign_cluster, "outcome": outcome}
        self._meter.create_counter(PUSHES, "Advertisement pushes to a foreign cluster").add(1, attributes)
        self._meter.create_histogram_timedelta(
            PUSH_LATENCY, "Time of one push: credentials and Advertisement written to the foreign cluster", "ms"
        ).record(latency, attributes)

    def advertised(self, *, foreign_cluster: str, resources: Resources) -> None:
        """What the last push offered the foreign cluster; zero once the peering is withdrawn."""
        attributes = {"foreign_cluster": foreign_cluster}
        self._meter.create_gauge_float(ADVERTISED_CPU, "CPU advertised to the foreign cluster", "cores").set(
            float(resources.get_or_zero("cpu")), attributes
        )
        self._meter.create_gauge_float(ADVERTISED_MEMORY, "Memory advertised to the foreign cluster", "bytes").set(
            float(resources.get_or_zero("memory")), attributes
        )

    def decided(self, *, provider: str, phase: str, reason: str) -> None:
        self._meter.create_counter(
            ACCEPTANCE_DECISIONS, "Admission decisions on Advertisements (counted when a decision changes)"
        ).add(1, {"provider": provider, "phase": phase, "reason": reason})

    def placed(self, *, clusters: dict[str, int]) -> None:
        counter = self._meter.create_counter(PLACEMENTS, "Namespace slices placed on a super cluster")
        for cluster, slices in clusters.items():
            counter.add(slices, {"super_cluster": cluster})

    def placement_failed(self, *, reason: str) -> None:
        self._meter.create_counter(
            PLACEMENT_FAILURES, "Namespaces the pool could not place (counted when the reason changes)"
        ).add(1, {"reason": reason})

    def reflected_pods(self, *, provider: str, count: int) -> None:
        self._meter.create_gauge(REFLECTED_PODS, "Pods of this virtual node running in the provider").set(
            count, {"provider": provider}
        )

    def super_cluster_health(self, *, super_cluster: str, state: HealthState) -> None:
        """A state set: 1 for the super cluster's current health, 0 for the others."""
        gauge = self._meter.create_gauge(SUPER_CLUSTER_HEALTH, "A super cluster's health as the pool's prober sees it")
        for each in get_args(HealthState):
            gauge.set(1 if each == state else 0, {"super_cluster": super_cluster, "state": each})
