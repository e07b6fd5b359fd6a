"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it: of the
replicas of one worker, one runs the watchers that turn Kubernetes changes into workflow starts and
signals (N watchers would send N times the signals the steady state budgets). Every replica serves
workflow and activity tasks whatever the election says: Temporal hands each task to one poller. Built by
workers/cluster.py and workers/pool.py.

The rules, in the order of the code:
1. a replica takes the Lease when nobody holds it, when it holds it already, or when the holder's record
   has not changed for its leaseDurationSeconds, timed on this replica's own monotonic clock from when it
   saw the record change (no clocks are compared across machines);
2. every write is an update at the resourceVersion read (or a create), so of two replicas racing for
   the Lease one wins and the other gets a conflict;
3. the leader renews every retry period; one that sees another holder stops at once, one that cannot
   renew stops after the renew deadline, which is shorter than the lease duration: it has stopped before
   anyone may take over;
4. stopping releases the Lease (holder cleared), so a rolling restart hands over within a retry period;
   a replica that dies (kill -9) is replaced once the lease duration has passed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kube.clock import utcnow
from kube.objects import raw_json
from models.names import LABEL_MANAGED_BY, MANAGED_BY
from models.settings import LeaderSettings
from models.times import format_micro_time

log = logging.getLogger(__name__)


# A kubelet's heartbeat (virtual kubelets' nodes, the syncers' tenant nodes): a Lease in kube-node-lease named as
# the node, of NODE_LEASE_SECONDS, renewed every NODE_LEASE_RENEW_SECONDS (a quarter of it, a kubelet's default).
NODE_LEASE_NAMESPACE = "kube-node-lease"
NODE_LEASE_SECONDS = 40
NODE_LEASE_RENEW_SECONDS = 10


def renew_node_lease(api: k8s.ApiClient, node: str) -> None:
    """A node's heartbeat: the node-lifecycle controller keeps it Ready while this Lease is renewed."""
    renew_lease(api, NODE_LEASE_NAMESPACE, node, holder=node, duration_seconds=NODE_LEASE_SECONDS)


def renew_lease(api: k8s.ApiClient, namespace: str, name: str, *, holder: str, duration_seconds: int) -> None:
    """A heartbeat Lease (a virtual node's, a consumer's keepalive): renewTime now, created on first renewal.
    One writer, no election: a plain patch, without the resourceVersion LeaderElection writes at."""
    leases = k8s.CoordinationV1Api(api)
    spec = {"holderIdentity": holder, "leaseDurationSeconds": duration_seconds, "renewTime": format_micro_time(utcnow())}
    try:
        leases.patch_namespaced_lease(name, namespace, {"spec": spec})
    except ApiException as e:
        if e.status != 404:
            raise
        leases.create_namespaced_lease(namespace, k8s.V1Lease.model_validate({"metadata": {"name": name}, "spec": spec}))


class LeaderElection:
    def __init__(
        self,
        api: k8s.ApiClient,
        *,
        lease: str,
        namespace: str,
        identity: str,
        settings: LeaderSettings,
        on_started_leading: Callable[[], None],
        on_stopped_leading: Callable[[], None],
    ) -> None:
        """The callbacks run in the election's thread and must return promptly: start or stop watchers."""
        self.lease, self.namespace, self.identity = lease, namespace, identity
        self._coordination = k8s.CoordinationV1Api(api)
        self._settings = settings
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        # A request that hangs must not outlast the renew deadline: the leader would watch on unrenewed.
        self._timeout = settings.renew_deadline_seconds / 2
        self._observed_version: str | None = None
        self._observed_at = 0.0  # time.monotonic() when the record was last seen to change
        self._observed_holder: tuple[str, float] | None = None  # another replica's identity, its lease duration
        self._leading = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"leader-{lease}", daemon=True)

    def start(self) -> LeaderElection:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops leading (the watchers first) and releases the Lease for the next replica."""
        self._stop.set()
        self._thread.join(timeout=self._settings.renew_deadline_seconds + 10)

    def is_leader(self) -> bool:
        return self._leading.is_set()

    def led(self) -> bool:
        """Whether some replica leads, as this one last saw: itself, or another whose record changed within
        its lease duration (on this replica's clock, rule 1). False before the first read, and while the Lease
        is free or its holder's record has gone stale (a leader changing)."""
        if self._leading.is_set():
            return True
        holder = self._observed_holder
        return holder is not None and time.monotonic() - self._observed_at < holder[1]

    def _run(self) -> None:
        renewed_at = 0.0
        try:
            while not self._stop.is_set():
                try:
                    held: bool | None = self._try_acquire_or_renew()
                except Exception as e:  # noqa: BLE001 - unknown: the renew deadline decides (rule 3)
                    log.warning("lease %s/%s: %s", self.namespace, self.lease, e)
                    held = None
                now = time.monotonic()
                if held:
                    renewed_at = now
                    if not self._leading.is_set():
                        log.info("lease %s/%s: %s leads", self.namespace, self.lease, self.identity)
                        self._leading.set()
                        self._on_started()
                elif self._leading.is_set() and (held is False or now - renewed_at > self._settings.renew_deadline_seconds):
                    log.warning("lease %s/%s: %s stops leading (%s)", self.namespace, self.lease, self.identity,
                                "another replica holds it" if held is False else "not renewed within the deadline")  # fmt: skip
                    self._stop_leading()
                self._stop.wait(self._settings.retry_period_seconds)
        finally:
            if self._leading.is_set():
                self._stop_leading()
                self._release()

    def _stop_leading(self) -> None:
        self._leading.clear()
        self._on_stopped()

    def _read(self) -> dict[str, Any] | None:
        try:
            response = self._coordination.read_namespaced_lease(self.lease, self.namespace, _preload_content=False,
                                                                _request_timeout=self._timeout)  # fmt: skip
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return raw_json(response)

    def _try_acquire_or_renew(self) -> bool | None:
        """True: this replica holds the Lease now; False: another does (rule 1); None or an exception: it
        cannot tell (a conflicting write, the API server unreachable)."""
        now = utcnow()
        lease = self._read()
        if lease is None:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.lease, "namespace": self.namespace,
                                 "labels": {LABEL_MANAGED_BY: MANAGED_BY}},
                    "spec": self._spec(now, acquired=now, transitions=0)}  # fmt: skip
            return self._write(self._coordination.create_namespaced_lease, self.namespace, body)
        spec = lease.get("spec") or {}
        version = lease["metadata"]["resourceVersion"]
        if version != self._observed_version:
            self._observed_version, self._observed_at = version, time.monotonic()
        holder = spec.get("holderIdentity")
        duration = spec.get("leaseDurationSeconds") or self._settings.lease_duration_seconds
        self._observed_holder = (holder, duration) if holder and holder != self.identity else None
        if holder and holder != self.identity and time.monotonic() - self._observed_at < duration:
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            lease["spec"] = self._spec(now, acquired=spec.get("acquireTime") or now, transitions=transitions)
        else:
            lease["spec"] = self._spec(now, acquired=now, transitions=transitions + 1)
        return self._write(self._coordination.replace_namespaced_lease, self.lease, self.namespace, lease)

    def _spec(self, now: datetime, *, acquired: datetime | str, transitions: int) -> dict[str, Any]:
        return {"holderIdentity": self.identity, "leaseDurationSeconds": self._settings.lease_duration_seconds,
                "acquireTime": acquired if isinstance(acquired, str) else format_micro_time(acquired),
                "renewTime": format_micro_time(now), "leaseTransitions": transitions}  # fmt: skip

    def _write(self, call: Callable[..., Any], *args: Any) -> bool | None:
        try:
            written = call(*args, _preload_content=False, _request_timeout=self._timeout)
        except ApiException as e:
            if e.status == 409:  # another replica wrote first (rule 2): the next read tells who holds it
                return None
            raise
        self._observed_version = raw_json(written)["metadata"]["resourceVersion"]
        self._observed_at = time.monotonic()
        return True

    def _release(self) -> None:
        """Rule 4: clear the holder so that the next replica need not wait out the lease duration."""
        try:
            lease = self._read()
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"] = dict(lease["spec"], holderIdentity=None, leaseDurationSeconds=1,
                                 renewTime=format_micro_time(utcnow()))  # fmt: skip
            self._write(self._coordination.replace_namespaced_lease, self.lease, self.namespace, lease)
            log.info("lease %s/%s: released by %s", self.namespace, self.lease, self.identity)
        except Exception as e:  # noqa: BLE001 - the others take over after the lease duration instead
            log.warning("lease %s/%s: not released: %s", self.namespace, self.lease, e)
