"""The process's Prometheus endpoint: a Temporal runtime whose telemetry serves the SDK's metrics and
tidepool's own (kube/metrics.py) on MetricsSettings.port, one endpoint per process. Used by the
cluster and pool workers (their Temporal client runs on it) and by the virtual kubelet (no client: it
records through the runtime's meter)."""

from __future__ import annotations

from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from kube.metrics import HISTOGRAM_BUCKETS


def metrics_runtime(port: int, *, host: str = "0.0.0.0") -> Runtime | None:  # noqa: S104 - scraped from outside the pod
    """A runtime serving /metrics on host:port; None (the SDK's default runtime, no endpoint) for port 0."""
    if not port:
        return None
    prometheus = PrometheusConfig(
        bind_address=f"{host}:{port}",
        histogram_bucket_overrides={name: list(buckets) for name, buckets in HISTOGRAM_BUCKETS.items()},
    )
    return Runtime(telemetry=TelemetryConfig(metrics=prometheus))
