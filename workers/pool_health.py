"""The pool's health prober, a thread of the pool worker (workers/pool.py): every probeIntervalSeconds
(ClusterConfig spec.pool in the tenant control plane) it lists each super cluster's nodes, decides its
health (models/pool/health.py) and writes the SuperCluster's status only when that changes. It never
signals the scheduler itself: the pool's SuperCluster watcher does, when the Ready condition or the
allocatable it keys on moves (models/pool/triggers.py). A cluster that keeps answering, or keeps
failing, writes nothing and wakes nobody.

Clusters are probed in parallel, each with a request timeout below the interval, so that one silent
cluster never delays the verdict on the others."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio.common import MetricMeter
from temporalio.exceptions import ApplicationError

from kube.clients import OwnSecretClients
from kube.clock import utcnow
from kube.errors import as_application_error
from kube.metrics import Metrics
from kube.objects import list_cluster_objects, read_cluster_config
from kube.status import CustomObjectStatus, write_status
from models.api import SuperCluster
from models.api.clusterconfig import PoolConfig
from models.names import SUPER_CLUSTERS
from models.pool.health import Health, ProbeOutcome, health_from_status, next_health, probe_of_nodes
from models.resources import Resources

log = logging.getLogger("tidepool.pool.health")
MAX_REQUEST_TIMEOUT = 5.0  # seconds: a probe that takes longer than this is a failed one


class HealthProber:
    def __init__(self, tenant: k8s.ApiClient, *, meter: MetricMeter = MetricMeter.noop,
                 now: Callable[[], datetime] = utcnow) -> None:  # fmt: skip
        self._tenant, self._secrets, self._now = tenant, OwnSecretClients(tenant), now
        self._metrics = Metrics(meter)
        self._status = CustomObjectStatus(tenant, SUPER_CLUSTERS)
        self._stop = threading.Event()
        self._executor = ThreadPoolExecutor(8, thread_name_prefix="pool-probe")
        self._thread = threading.Thread(target=self._loop, name="pool-health", daemon=True)

    def start(self) -> HealthProber:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=MAX_REQUEST_TIMEOUT + 5)
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            interval = PoolConfig().probe_interval_seconds
            try:
                interval = self.probe_round()
            except Exception as e:  # noqa: BLE001 - the tenant control plane did not answer: the next round tries again
                log.warning("pool health: probe round failed: %s", type(e).__name__)
            self._stop.wait(interval)

    def probe_round(self) -> int:
        """Probes every SuperCluster once and writes what changed; returns the seconds until the next round."""
        config = read_cluster_config(self._tenant).spec.pool
        listed = list_cluster_objects(self._tenant, SUPER_CLUSTERS)
        clusters = [SuperCluster.from_kubernetes(obj) for obj in listed]
        timeout = min(MAX_REQUEST_TIMEOUT, float(config.probe_interval_seconds))
        outcomes = list(self._executor.map(lambda cluster: self._probe(cluster, timeout), clusters))
        grace = timedelta(seconds=config.unreachable_grace_period_seconds)
        for obj, cluster, outcome in zip(listed, clusters, outcomes, strict=True):
            name = cluster.metadata.name
            # The status is the prober's only memory: a restarted prober goes on counting the grace period
            # from failingSince, and a SuperCluster recreated under the same name (an empty status) is
            # written again rather than taken for the one this process saw.
            previous = health_from_status(obj.get("status"))
            health = next_health(previous, outcome, now=self._now(), grace=grace)
            if health != previous:
                try:
                    self._write(obj, health)
                except ApiException as e:  # deleted meanwhile, or a conflict: the next round reads it again
                    log.warning("super cluster %s: status not written: %s", name, as_application_error(e).message)
                    continue
            self._metrics.super_cluster_health(super_cluster=name, state=health.state)
        return config.probe_interval_seconds

    def _probe(self, cluster: SuperCluster, timeout: float) -> ProbeOutcome:
        ref = cluster.spec.kube_config_ref
        try:
            api = self._secrets.get(name=ref.name, namespace=ref.namespace)
            # resourceVersion 0: served from the API server's cache, cheap on a large cluster.
            listed: Any = k8s.CoreV1Api(api).list_node(resource_version="0", _request_timeout=timeout,
                                                        _preload_content=False)  # fmt: skip
            nodes = json.loads(listed.data).get("items") or []
        except Exception as e:  # noqa: BLE001 - any failure to answer is a failed probe
            return ProbeOutcome(Resources(), failure=_said(e))
        return probe_of_nodes(nodes, tolerated=cluster.spec.tolerations.allowed)

    def _write(self, obj: dict[str, Any], health: Health) -> None:
        value = health.condition()
        if write_status(self._status, obj, fields=health.status(), conditions=[value] if value else []):
            log.info("super cluster %s: %s (%s)", obj["metadata"]["name"], health.state, health.message)


def _said(error: Exception) -> str:
    """Why a probe failed, fit for a status: the vocabulary's message (never str(ApiException): it carries
    headers and body), tidepool's own (a missing kubeconfig Secret), else only the error's type."""
    if isinstance(error, ApiException):
        return as_application_error(error).message
    if isinstance(error, ApplicationError):
        return error.message
    return f"the API server did not answer ({type(error).__name__})"
