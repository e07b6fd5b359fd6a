"""The processes' settings: defaults pinned, environment variables mapped, bad values named; the virtual
kubelet reads back exactly what its Deployment writes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from models.settings import VirtualKubeletProcessSettings, VirtualKubeletSettings, WorkerSettings
from models.virtual_kubelet import virtual_kubelet_deployment


def test_the_defaults_are_pinned() -> None:
    assert WorkerSettings().model_dump() == {
        "cluster": {"cluster_id": "home", "kubeconfig": None, "api_server_for_peers": None, "pod_cidr": "10.0.0.0/16"},
        "temporal": {"address": "127.0.0.1:7233", "namespace": "default", "api_key_file": None,
                     "tls_cert_file": None, "tls_key_file": None, "tls_ca_file": None},
        "provider": {"token_lifetime_seconds": 3600, "unreachable_backoff_max_seconds": 300},
        "metrics": {"port": 9464},
        "health": {"port": 8081},
        "virtual_kubelet": {"image": "tidepool:latest", "metrics_port": 9464, "kubelet_port": 10250, "pod_workers": 8,
                            "config_workers": 4, "service_workers": 2, "event_workers": 2, "namespace_workers": 2,
                            "keepalive_renew_seconds": 30, "node_selector": {}, "tolerations": ()},
        "leader": {"identity": None, "lease_duration_seconds": 15, "renew_deadline_seconds": 10,
                   "retry_period_seconds": 2.0},
    }  # fmt: skip


def test_environment_variables_set_fields_by_part_and_name() -> None:
    settings = WorkerSettings.from_env({"TIDEPOOL_CLUSTER_CLUSTER_ID": "east", "TIDEPOOL_TEMPORAL_ADDRESS": "t:7233"})
    assert settings.cluster.cluster_id == "east"
    assert settings.temporal.address == "t:7233"
    assert settings.task_queue == "tidepool-east"
    image = WorkerSettings.from_env({"TIDEPOOL_VIRTUAL_KUBELET_IMAGE": "ghcr.io/tidepool/tidepool:0.1.0"})
    assert image.virtual_kubelet.image == "ghcr.io/tidepool/tidepool:0.1.0"


@pytest.mark.parametrize(
    ("variable", "value", "field"),
    [
        pytest.param("TIDEPOOL_CLUSTER_CLUSTER_ID", "East_1", "cluster.cluster_id", id="a cluster id must be a DNS label"),
        pytest.param("TIDEPOOL_PROVIDER_TOKEN_LIFETIME_SECONDS", "7200", "provider.token_lifetime_seconds",
                     id="a token lives at most one hour"),
        pytest.param("TIDEPOOL_METRICS_PORT", "70000", "metrics.port", id="a port fits in 16 bits"),
        pytest.param("TIDEPOOL_CLUSTER_POD_CIDR", "10.0.0.1/16", "cluster.pod_cidr",
                     id="a PodCIDR no consumer would accept stops the worker at start"),
        pytest.param("TIDEPOOL_VIRTUAL_KUBELET_NODE_SELECTOR", '{"node role": "system"}', "virtual_kubelet.node_selector",
                     id="a node selector's keys are label keys"),
        pytest.param("TIDEPOOL_VIRTUAL_KUBELET_NODE_SELECTOR", "role=system", "virtual_kubelet.node_selector",
                     id="a node selector is a JSON object"),
        pytest.param("TIDEPOOL_VIRTUAL_KUBELET_TOLERATIONS", '[{"key": "dedicated", "effect": "NoSchedul"}]',
                     "virtual_kubelet.tolerations.0.effect", id="a toleration's effect is one of Kubernetes'"),
        pytest.param("TIDEPOOL_VIRTUAL_KUBELET_TOLERATIONS", '[{"value": "x"}]', "virtual_kubelet.tolerations.0",
                     id="a toleration without a key tolerates every taint, with operator Exists only"),
        pytest.param("TIDEPOOL_VIRTUAL_KUBELET_TOLERATIONS", '[{"key": "tidepool.io/virtual-node", "operator": "Exists"}]',
                     "virtual_kubelet.tolerations.0", id="a virtual kubelet's pod never goes to a virtual node"),
        pytest.param("TIDEPOOL_VIRTUAL_KUBELET_TOLERATIONS", '[{"operator": "Exists"}]', "virtual_kubelet.tolerations.0",
                     id="nor tolerates every taint, the virtual nodes' among them"),
        pytest.param("TIDEPOOL_VIRTUAL_KUBELET_TOLERATIONS", f'[{{"key": "{"k" * 64}", "operator": "Exists"}}]',
                     "virtual_kubelet.tolerations.0.key", id="a toleration's key is a label key"),
        pytest.param("TIDEPOOL_LEADER_RENEW_DEADLINE_SECONDS", "20", "renew_deadline_seconds < lease_duration_seconds",
                     id="a leader stops before another may take over"),
    ],
)  # fmt: skip
def test_a_bad_value_is_refused_with_its_field(variable: str, value: str, field: str) -> None:
    with pytest.raises(ValidationError) as error:
        WorkerSettings.from_env({variable: value})
    assert field in str(error.value).replace("\n", ".")


def test_the_virtual_kubelets_pods_go_where_their_placement_says() -> None:
    settings = WorkerSettings.from_env({
        "TIDEPOOL_VIRTUAL_KUBELET_NODE_SELECTOR": '{"node-role.example.com/system": ""}',
        "TIDEPOOL_VIRTUAL_KUBELET_TOLERATIONS": '[{"key": "dedicated", "value": "system", "effect": "NoSchedule"}, '
                                                '{"key": "gone", "operator": "Exists", "effect": "NoExecute", '
                                                '"tolerationSeconds": 30}]',
    }).virtual_kubelet  # fmt: skip
    deployment = virtual_kubelet_deployment(provider_id="a", consumer_id="b", advertisement="advertisement-a",
                                            kubeconfig_secret="k", settings=settings)  # fmt: skip
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"node-role.example.com/system": ""}
    assert pod["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "system", "effect": "NoSchedule"},
        {"key": "gone", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}]  # fmt: skip
    unplaced = virtual_kubelet_deployment(provider_id="a", consumer_id="b", advertisement="advertisement-a",
                                          kubeconfig_secret="k")  # fmt: skip
    assert "nodeSelector" not in unplaced["spec"]["template"]["spec"]
    assert "tolerations" not in unplaced["spec"]["template"]["spec"]


def test_an_empty_variable_leaves_the_default() -> None:
    settings = WorkerSettings.from_env({"TIDEPOOL_LEADER_IDENTITY": "", "TIDEPOOL_METRICS_PORT": ""})
    assert settings == WorkerSettings()


def test_the_virtual_kubelet_reads_what_its_deployment_writes() -> None:
    tuning = VirtualKubeletSettings(metrics_port=0, kubelet_port=10251, pod_workers=3, config_workers=5,
                                    service_workers=0, event_workers=1, namespace_workers=6,
                                    keepalive_renew_seconds=10)  # fmt: skip
    deployment = virtual_kubelet_deployment(provider_id="a", consumer_id="b", advertisement="advertisement-a",
                                            kubeconfig_secret="k", namespace="ns", settings=tuning)  # fmt: skip
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    # The downward API gives the pod's IP; an empty one (not known yet) is unset.
    environ = {item["name"]: item.get("value", "") for item in env}
    read = VirtualKubeletProcessSettings.from_env(environ)
    assert read == VirtualKubeletProcessSettings(
        provider_id="a", consumer_id="b", advertisement="advertisement-a", namespace="ns",
        provider_kubeconfig="/etc/tidepool/provider/kubeconfig", **tuning.model_dump(exclude={"image", "node_selector", "tolerations"}))  # fmt: skip
    assert read.node_ip is None and read.consumer_kubeconfig is None


def test_a_virtual_kubelet_without_its_provider_does_not_start() -> None:
    with pytest.raises(ValidationError) as error:
        VirtualKubeletProcessSettings.from_env({"TIDEPOOL_VK_CONSUMER_ID": "b", "TIDEPOOL_VK_POD_WORKERS": "0"})
    problems = str(error.value)
    assert "provider_id" in problems and "pod_workers" in problems
