"""The process's Prometheus endpoint: a Temporal runtime whose telemetry serves the SDK's metrics and
tidepool's own (kube/metrics.py) on MetricsSettings.port, one endpoint per process. Used by the
cluster and pool workers (their Temporal client runs on it) and by the virtual kubelet (no client: it
records through the runtime's meter). Every series carries `service`, the process that serves it, and
counters end in `_total` (Prometheus' naming). The address is logged at start, in a line the demo reads
back for the processes it did not choose a port for (the virtual kubelets)."""

from __future__ import annotations

import logging
import re
from typing import Literal

from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from kube.metrics import HISTOGRAM_BUCKETS

log = logging.getLogger("tidepool.metrics")

# The `service` label: which tidepool process a series comes from (the SDK's own `service_name` would say
# temporal-core-sdk for all of them, and is left off).
Service = Literal["worker", "pool", "virtual-kubelet"]
# What the start line says; METRICS_LINE reads it back.
_LINE = "metrics of %s on http://%s/metrics"
METRICS_LINE = re.compile(r"metrics of (?P<service>[-a-z]+) on (?P<url>http://\S+/metrics)")


def metrics_runtime(port: int, *, service: Service, host: str = "0.0.0.0") -> Runtime | None:  # noqa: S104 - scraped from outside the pod
    """A runtime serving /metrics on host:port; None (the SDK's default runtime, no endpoint) for port 0."""
    if not port:
        log.info("metrics of %s: off (port 0)", service)
        return None
    prometheus = PrometheusConfig(
        bind_address=f"{host}:{port}",
        counters_total_suffix=True,
        histogram_bucket_overrides={name: list(buckets) for name, buckets in HISTOGRAM_BUCKETS.items()},
    )
    runtime = Runtime(telemetry=TelemetryConfig(metrics=prometheus, global_tags={"service": service},
                                                attach_service_name=False))  # fmt: skip
    log.info(_LINE, service, f"{host}:{port}")
    return runtime
