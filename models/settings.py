"""The processes' settings: one model made of per-topic parts, every field with a default and its unit.

A cluster's worker is set by TIDEPOOL_<PART>_<FIELD> environment variables, a virtual kubelet by the
TIDEPOOL_VK_<FIELD> ones its Deployment gives it (models/virtual_kubelet.py). Each process reads its
environment once, in its main (workers/*), and hands the environment to `from_env` here, which reads
nothing itself; the settings are then handed down. The protocol's own knobs (sharing percentage,
acceptance policy, periods) live in the cluster's ClusterConfig instead, so that they can change without
a restart. tests/test_settings.py pins the defaults.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from models.api.offloading import LABEL_VALUE
from models.names import (
    KEEPALIVE_MIN_RENEW_SECONDS,
    KEEPALIVE_RENEW_SECONDS,
    KUBELET_PORT,
    SYSTEM_NAMESPACE,
    TAINT_VIRTUAL_NODE,
    task_queue,
)
from models.network import pod_cidr_problem
from models.offloading import check_label_key, check_label_value

VIRTUAL_KUBELET_ENV_PREFIX = "TIDEPOOL_VK_"


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TemporalSettings(_Part):
    address: str = Field(default="127.0.0.1:7233", description="host:port of the Temporal frontend.")
    namespace: str = Field(default="default", description="Temporal namespace this cluster's workflows live in.")
    api_key_file: str | None = Field(
        default=None, description="Path of a file holding a Temporal Cloud API key (mounted from a Secret)."
    )
    tls_cert_file: str | None = Field(default=None, description="Client certificate for mTLS (PEM path).")
    tls_key_file: str | None = Field(default=None, description="Client key for mTLS (PEM path).")
    tls_ca_file: str | None = Field(default=None, description="CA bundle for the server certificate (PEM path).")


class ClusterSettings(_Part):
    cluster_id: str = Field(
        default="home", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63,
        description="This cluster's identity in the peering protocol (a DNS-1123 label).",
    )  # fmt: skip
    kubeconfig: str | None = Field(default=None, description="Path of the kubeconfig; unset means in-cluster.")
    api_server_for_peers: str | None = Field(
        default=None,
        description="The API server URL foreign clusters use to reach this one; unset means the kubeconfig's.",
    )
    pod_cidr: str = Field(default="10.0.0.0/16", description="This cluster's PodCIDR, advertised to peers.")

    @field_validator("pod_cidr")
    @classmethod
    def _advertisable(cls, value: str) -> str:
        # Checked at start: every push validates its Advertisement (models/api/advertisement.py), and one
        # that no consumer could accept would fail each push instead.
        if problem := pod_cidr_problem(value):
            raise ValueError(problem)
        return value


class ProviderSettings(_Part):
    token_lifetime_seconds: int = Field(
        default=3600, ge=600, le=3600,
        description="Lifetime of the token handed to a foreign cluster, in seconds; renewed on every push.",
    )  # fmt: skip
    unreachable_backoff_max_seconds: int = Field(
        default=300, ge=1,
        description="Longest wait between attempts to reach a foreign cluster (its pushes and the watch of its "
        "decision), in seconds; a peering keeps the value of the worker that started it.",
    )  # fmt: skip


class MetricsSettings(_Part):
    port: int = Field(default=9464, ge=0, le=65535, description="Port of the Prometheus endpoint; 0 disables it.")


class HealthSettings(_Part):
    port: int = Field(
        default=8081, ge=0, le=65535,
        description="Port of the health probes (/healthz; /readyz once connected to Temporal and serving); 0: none.",
    )  # fmt: skip


class Toleration(_Part):
    """A Kubernetes toleration, with its own field names (tolerationSeconds), as a pod spec has it; empty
    strings read as Kubernetes reads them (no key, Equal, every effect)."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)
    key: str | None = Field(default=None, min_length=1)
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = Field(default=None, max_length=63, pattern=LABEL_VALUE)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _empty_is_unset(cls, data: object) -> object:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v != ""}
        return data

    @field_validator("key")
    @classmethod
    def _label_key(cls, key: str) -> str:
        check_label_key("key", key)
        return key

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        # The API server's rules (validation of core/v1 tolerations), checked at the worker's start instead of
        # at each virtual kubelet Deployment it would fail to apply; and one of ours.
        if self.operator == "Exists" and self.value:
            raise ValueError("value must be empty with operator Exists")
        if self.key is None and self.operator != "Exists":
            raise ValueError("operator must be Exists when key is empty (a toleration of every taint)")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds is only for effect NoExecute")
        if self.key in (None, TAINT_VIRTUAL_NODE):
            raise ValueError(f"a virtual kubelet's pod may not tolerate the virtual nodes' taint {TAINT_VIRTUAL_NODE} "
                             "(it would be scheduled onto a virtual node, which refuses it), nor every taint")  # fmt: skip
        return self

    def manifest(self) -> dict[str, object]:
        return self.model_dump(by_alias=True, exclude_none=True)


class VirtualKubeletSettings(_Part):
    image: str = Field(
        default="tidepool:latest", min_length=1,
        description="Container image of the virtual kubelet Deployments the consumer creates (a registry reference).",
    )  # fmt: skip
    metrics_port: int = Field(
        default=9464, ge=0, le=65535, description="Port of each virtual kubelet's Prometheus endpoint; 0 disables it."
    )
    kubelet_port: int = Field(
        default=KUBELET_PORT, ge=1, le=65535,
        description="Port of each virtual kubelet's kubelet API (logs, exec), published as its node's kubelet endpoint.",
    )  # fmt: skip
    # Workers per reflected kind, as Liqo's --<kind>-reflection-workers: each kind has its own queue, so
    # that a burst of one (a thousand pods) does not hold up another (a Service's endpoints).
    pod_workers: int = Field(default=8, ge=1, le=64, description="Threads reflecting pods to the provider.")
    config_workers: int = Field(
        default=4, ge=1, le=64,
        description="Threads reflecting the ConfigMaps and Secrets offloaded pods use (their edits and deletions).",
    )  # fmt: skip
    service_workers: int = Field(
        default=2, ge=0, le=64,
        description="Threads reflecting the Services of namespaces with offloaded pods; 0 reflects no Service.",
    )  # fmt: skip
    event_workers: int = Field(
        default=2, ge=0, le=64,
        description="Threads reflecting the provider's Events about pod copies onto the consumer's pods; 0: none.",
    )  # fmt: skip
    namespace_workers: int = Field(
        default=2, ge=1, le=64,
        description="Threads asking the provider for the offloaded namespaces' remote namespaces, and draining them.",
    )  # fmt: skip
    keepalive_renew_seconds: int = Field(
        default=KEEPALIVE_RENEW_SECONDS, ge=KEEPALIVE_MIN_RENEW_SECONDS, le=KEEPALIVE_RENEW_SECONDS,
        description="How often each virtual kubelet renews its keepalive in its provider; the provider deletes the "
        "copies of a consumer silent for max(the Advertisement's time to live, 4 renewals, 1 minute).",
    )  # fmt: skip
    # Where their pods run, as Liqo's VirtualKubeletOptions: nodes of the consumer's own choosing (its system
    # nodes, say), never the virtual nodes (Toleration refuses their taint).
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Labels a node must have to run the virtual kubelets' pods (a JSON object, as a pod's "
        "nodeSelector); empty: any node.",
    )  # fmt: skip
    tolerations: tuple[Toleration, ...] = Field(
        default=(), max_length=32,
        description="Taints the virtual kubelets' pods tolerate (a JSON list of Kubernetes tolerations), e.g. "
        "those of dedicated system nodes; never the virtual nodes' taint, nor every taint.",
    )  # fmt: skip

    @field_validator("node_selector", "tolerations", mode="before")
    @classmethod
    def _from_json(cls, value: object) -> object:
        """An environment variable's JSON text; a JSON error names the field (pydantic adds which)."""
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"not JSON: {e}") from None
        return value

    @field_validator("node_selector")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > 32:
            raise ValueError(f"{len(value)} labels, more than 32")
        for key, label in value.items():
            check_label_key("key", key)
            check_label_value(key, label)
        return value

    def placement(self) -> dict[str, object]:
        """The pod spec's fields that place a virtual kubelet's pod; none when unset."""
        placement: dict[str, object] = {}
        if self.node_selector:
            placement["nodeSelector"] = dict(self.node_selector)
        if self.tolerations:
            placement["tolerations"] = [t.manifest() for t in self.tolerations]
        return placement


class VirtualKubeletProcessSettings(VirtualKubeletSettings):
    """What one virtual kubelet process serves, and its tuning as the consumer's VirtualKubeletSettings set
    it: the environment of the Deployment built by models/virtual_kubelet.py: virtual_kubelet_deployment."""

    provider_id: str = Field(min_length=1, description="The provider cluster whose resources the node stands for.")
    consumer_id: str = Field(min_length=1, description="This (the consumer) cluster's id.")
    advertisement: str = Field(min_length=1, description="Name of the accepted Advertisement the node serves.")
    namespace: str = Field(default=SYSTEM_NAMESPACE, description="Namespace of the Deployment and its Lease.")
    provider_kubeconfig: str = Field(min_length=1, description="Path of the kubeconfig that reaches the provider.")
    consumer_kubeconfig: str | None = Field(default=None, description="Path of the consumer's kubeconfig; unset "
                                            "means in-cluster.")  # fmt: skip
    node_ip: str | None = Field(default=None, description="The pod's IP, the node's InternalIP; unset serves no "
                                "kubelet API.")  # fmt: skip

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> VirtualKubeletProcessSettings:
        """TIDEPOOL_VK_<FIELD>, e.g. TIDEPOOL_VK_PROVIDER_ID or TIDEPOOL_VK_POD_WORKERS."""
        return cls.model_validate(_variables(environ, VIRTUAL_KUBELET_ENV_PREFIX, cls))


class LeaderSettings(_Part):
    """Of a worker's replicas, one runs the watchers that signal workflows (kube/lease.py); client-go's
    defaults. Every replica serves workflow and activity tasks whatever the election says."""

    identity: str | None = Field(
        default=None, min_length=1, max_length=253,
        description="This replica's name in the Lease, unique among live replicas (the pod's name in "
        "deploy/base, so a restarted container takes its own Lease back at once); unset means "
        "host-pid-random, which a restarted process cannot reclaim before the lease duration.",
    )  # fmt: skip
    lease_duration_seconds: int = Field(
        default=15, ge=2, le=300,
        description="Seconds a Lease not renewed keeps other replicas out: how long a dead leader's watchers "
        "stay silent before another replica's start.",
    )  # fmt: skip
    renew_deadline_seconds: int = Field(
        default=10, ge=1,
        description="Seconds a leader goes on without a successful renewal before it stops its watchers; "
        "shorter than the lease duration, so that two replicas never watch at once.",
    )  # fmt: skip
    retry_period_seconds: float = Field(
        default=2.0, gt=0,
        description="Seconds between a leader's renewals and between a candidate's attempts (one API write "
        "or read each).",
    )  # fmt: skip

    @model_validator(mode="after")
    def _ordered(self) -> LeaderSettings:
        if not self.retry_period_seconds < self.renew_deadline_seconds < self.lease_duration_seconds:
            raise ValueError(
                "retry_period_seconds < renew_deadline_seconds < lease_duration_seconds must hold: a leader "
                "stops before another replica may take over, and renews more than once before it stops"
            )
        return self


class WorkerSettings(_Part):
    cluster: ClusterSettings = ClusterSettings()
    temporal: TemporalSettings = TemporalSettings()
    provider: ProviderSettings = ProviderSettings()
    metrics: MetricsSettings = MetricsSettings()
    health: HealthSettings = HealthSettings()
    virtual_kubelet: VirtualKubeletSettings = VirtualKubeletSettings()
    leader: LeaderSettings = LeaderSettings()

    @property
    def task_queue(self) -> str:
        return task_queue(self.cluster.cluster_id)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> WorkerSettings:
        """TIDEPOOL_<PART>_<FIELD>, e.g. TIDEPOOL_CLUSTER_CLUSTER_ID or TIDEPOOL_TEMPORAL_ADDRESS."""
        parts: dict[str, dict[str, str]] = {}
        for part_name, part_field in cls.model_fields.items():
            part_type = part_field.annotation
            assert isinstance(part_type, type) and issubclass(part_type, BaseModel)
            if variables := _variables(environ, f"TIDEPOOL_{part_name}_".upper(), part_type):
                parts[part_name] = variables
        return cls.model_validate(parts)


def _variables(environ: Mapping[str, str], prefix: str, model: type[BaseModel]) -> dict[str, str]:
    """The fields of `model` that `environ` sets, as `prefix` + FIELD; an empty variable is an unset one (a
    manifest's `value: ""`, a downward-API field not known yet), so that the default applies."""
    return {name: value for name in model.model_fields if (value := environ.get(f"{prefix}{name}".upper()))}
