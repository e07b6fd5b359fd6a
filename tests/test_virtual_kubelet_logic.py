"""The virtual kubelet's pure parts: names, what a pod uses, the safe spec, the node."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client as k8s

from kube.copies import keepalive_grace, lapsed_since
from models.api.offloading import OffloadingCluster
from models.pods import StatusShape
from models.settings import VirtualKubeletSettings
from models.virtual_kubelet import (
    ORIGIN_VERSION,
    RemoteTarget,
    config_copy,
    foreign_ip_message,
    legacy_copy_may_go,
    moves_to_remote_namespace,
    namespace_not_ready_message,
    offloading_entry,
    overdue_for_force_delete,
    pod_copy,
    referenced_objects,
    reflected_name,
    remap_ip,
    remote_namespace_request,
    remote_target,
    safe_pod_spec,
    service_copy,
    status_for_consumer,
    virtual_kubelet_deployment,
    virtual_node,
    when_copy_lost,
)

pytestmark = pytest.mark.vk

SPEC = {
    "nodeName": "tidepool-a", "serviceAccountName": "builder", "priorityClassName": "high",
    "tolerations": [{"key": "tidepool.io/virtual-node", "operator": "Exists"}], "nodeSelector": {"x": "y"},
    "containers": [{
        "name": "main", "image": "busybox",
        "env": [{"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}],
        "envFrom": [{"configMapRef": {"name": "env"}}],
        "volumeMounts": [{"name": "settings", "mountPath": "/s"}, {"name": "kube-api-access-abcde", "mountPath": "/t"}],
    }],
    "volumes": [
        {"name": "settings", "configMap": {"name": "settings"}},
        {"name": "kube-api-access-abcde", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}},
                                                                    {"configMap": {"name": "kube-root-ca.crt"}}]}},
    ],
}  # fmt: skip


def test_reflected_names_carry_the_namespace_and_stay_short_and_distinct() -> None:
    assert reflected_name("shop", "web") == "shop-web"
    long_a, long_b = reflected_name("n" * 40, "a" * 40), reflected_name("n" * 40, "a" * 39 + "b")
    assert len(long_a) <= 63 and len(long_b) <= 63 and long_a != long_b


def test_a_pod_uses_its_config_maps_and_secrets_but_not_the_service_account_token() -> None:
    assert referenced_objects(SPEC) == ({"settings", "env"}, {"db"})


@pytest.mark.parametrize(("legacy", "prefix"), [
    pytest.param(False, "", id="in its remote namespace, the pod's ConfigMaps and Secrets keep their names"),
    pytest.param(True, "shop-", id="under the single-namespace layout, they were renamed to their reflections"),
])  # fmt: skip
def test_the_provider_copy_is_unbound_and_tokenless(legacy: bool, prefix: str) -> None:
    spec = safe_pod_spec(SPEC, legacy_namespace="shop" if legacy else None)
    for gone in ("nodeName", "serviceAccountName", "priorityClassName", "tolerations", "nodeSelector"):
        assert gone not in spec
    assert spec["automountServiceAccountToken"] is False
    assert [v["name"] for v in spec["volumes"]] == ["settings"]
    assert spec["volumes"][0]["configMap"]["name"] == f"{prefix}settings"
    container = spec["containers"][0]
    assert [m["name"] for m in container["volumeMounts"]] == ["settings"]
    assert container["env"][0]["valueFrom"]["secretKeyRef"]["name"] == f"{prefix}db"
    assert container["envFrom"][0]["configMapRef"]["name"] == f"{prefix}env"
    assert SPEC["nodeName"] == "tidepool-a"  # the consumer's spec is untouched


def test_the_virtual_node_carries_the_advertised_capacity_and_the_taint() -> None:
    node = virtual_node(provider_id="a", resources={"cpu": "4", "memory": "8Gi"}, ready=False, reason="PodCIDRNotSet",
                        message="waiting", heartbeat="t1", transition="t0")  # fmt: skip
    assert node["metadata"]["name"] == "tidepool-a"
    assert node["metadata"]["labels"]["tidepool.io/type"] == "virtual-node"
    assert node["spec"]["taints"] == [{"key": "tidepool.io/virtual-node", "value": "true", "effect": "NoExecute"}]
    assert node["status"]["allocatable"] == {"pods": "110", "cpu": "4", "memory": "8Gi"}
    assert node["status"]["conditions"][0]["reason"] == "PodCIDRNotSet"


def test_the_deployment_mounts_the_providers_secret_and_never_runs_two() -> None:
    deployment = virtual_kubelet_deployment(provider_id="a", consumer_id="b", advertisement="advertisement-a",
                                            kubeconfig_secret="tidepool-kubeconfig-a")  # fmt: skip
    assert deployment["metadata"]["name"] == "virtual-kubelet-a"
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "provider-kubeconfig", "secret": {"secretName": "tidepool-kubeconfig-a"}},
                              {"name": "tmp", "emptyDir": {}}]  # fmt: skip
    # A read-only root: the only writable place is its own /tmp (tests/test_deploy.py: Pod Security admits it).
    container = pod["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def test_the_deployment_runs_the_configured_image_with_its_ports_and_workers() -> None:
    settings = VirtualKubeletSettings(image="ghcr.io/tidepool/tidepool:0.1.0", metrics_port=9464, service_workers=0)
    deployment = virtual_kubelet_deployment(provider_id="a", consumer_id="b", advertisement="advertisement-a",
                                            kubeconfig_secret="k", settings=settings)  # fmt: skip
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "ghcr.io/tidepool/tidepool:0.1.0"
    assert {"name": "TIDEPOOL_VK_METRICS_PORT", "value": "9464"} in container["env"]
    assert {"name": "TIDEPOOL_VK_SERVICE_WORKERS", "value": "0"} in container["env"]  # Services not reflected
    # The API server dials the node's InternalIP (the pod's) at the kubelet port for logs and exec.
    assert {"name": "TIDEPOOL_VK_NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in container["env"]
    assert container["ports"] == [{"name": "kubelet", "containerPort": 10250}, {"name": "metrics", "containerPort": 9464}]
    off = virtual_kubelet_deployment(provider_id="a", consumer_id="b", advertisement="advertisement-a",
                                     kubeconfig_secret="k", settings=VirtualKubeletSettings(metrics_port=0))  # fmt: skip
    assert off["spec"]["template"]["spec"]["containers"][0]["ports"] == [{"name": "kubelet", "containerPort": 10250}]


NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(("deadline", "overdue"), [
    pytest.param(None, False, id="not being deleted"),
    pytest.param(NOW + timedelta(seconds=25), False, id="within its grace period"),
    pytest.param(NOW - timedelta(seconds=5), False, id="just past it: the provider may still confirm"),
    pytest.param(NOW - timedelta(seconds=11), True, id="past it by more than the margin"),
])  # fmt: skip
def test_teardown_force_deletes_a_copy_only_once_its_grace_period_is_well_past(
    deadline: datetime | None, overdue: bool
) -> None:
    assert overdue_for_force_delete(deadline, now=NOW) is overdue


CONSUMER_API_SERVICE_IP = "10.96.0.1"  # the consumer's own kubernetes Service: what a hostile provider points at


@pytest.mark.parametrize(("ip", "provider", "remapped", "shown"), [
    pytest.param("10.0.3.7", "10.0.0.0/16", "100.64.0.0/16", "100.64.3.7", id="the host part kept in the remapped block"),
    pytest.param("10.0.3.7", "10.0.0.0/16", "None", "10.0.3.7", id="no remapping needed: kept as it is"),
    pytest.param(CONSUMER_API_SERVICE_IP, "10.0.0.0/16", "None", None,
                 id="outside the advertised PodCIDR, no remapping: not shown"),
    pytest.param(CONSUMER_API_SERVICE_IP, "10.0.0.0/16", "100.64.0.0/16", None,
                 id="outside the advertised PodCIDR, remapped: not shown"),
    pytest.param("100.64.3.7", "10.0.0.0/16", "100.64.0.0/16", None,
                 id="an address already in the remapped block is not the provider's: not shown"),
    pytest.param("192.168.1.5", "10.0.0.0/16", "100.64.0.0/16", None, id="a provider node's address (host network): not shown"),
    pytest.param("10.0.3.7", "10.0.0.0/16", None, None, id="remapping not known yet: not shown yet"),
    pytest.param("10.0.3.7", None, "None", None, id="no advertised PodCIDR: nothing is a pod's"),
    pytest.param("not-an-ip", "10.0.0.0/16", "None", None, id="not an address: not shown"),
    pytest.param("fd00::7", "10.0.0.0/16", "None", None, id="another family than the advertised PodCIDR: not shown"),
    pytest.param("10.0.3.7", "10.0.0.0/16", "100.64.0.0/24", None, id="a remapped block of another size: not shown"),
    pytest.param("10.0.3.7", "10.0.0.0/16", "garbage", None, id="a remapped block that is no CIDR: not shown"),
])  # fmt: skip
def test_only_an_address_inside_the_advertised_podcidr_is_shown_through_the_remapping(
    ip: str, provider: str | None, remapped: str | None, shown: str | None
) -> None:
    assert remap_ip(ip, provider_pod_cidr=provider, remapped_pod_cidr=remapped) == shown


@pytest.mark.parametrize(("reported", "remapped", "shown", "foreign"), [
    pytest.param({"podIP": "10.0.3.7", "podIPs": [{"ip": "10.0.3.7"}]}, "100.64.0.0/16", "100.64.3.7", (),
                 id="a pod's address, remapped"),
    pytest.param({"podIP": CONSUMER_API_SERVICE_IP, "podIPs": [{"ip": CONSUMER_API_SERVICE_IP}]}, "None", None,
                 (CONSUMER_API_SERVICE_IP,), id="a consumer address reported: dropped and named"),
    pytest.param({"podIP": "10.0.3.7", "podIPs": [{"ip": "10.0.3.7"}, {"ip": "192.168.1.5"}]}, "None", "10.0.3.7",
                 ("192.168.1.5",), id="a foreign second address: the pod's shown, the other named"),
    pytest.param({"podIP": "bogus", "podIPs": ["x"]}, "None", None, ("bogus", "x"),
                 id="what is no address is dropped and named"),
    pytest.param({"podIP": "10.0.3.7"}, None, None, (), id="the remapping not known yet: nothing shown, nothing foreign"),
    pytest.param({"podIPs": [{"ip": f"192.168.0.{i}"} for i in range(50)]}, "None", None,
                 tuple(f"192.168.0.{i}" for i in range(4)), id="a flood of addresses: a few looked at"),
])  # fmt: skip
def test_the_consumer_pod_shows_only_its_providers_pod_address_and_the_rest_is_warned_of(
    reported: dict[str, Any], remapped: str | None, shown: str | None, foreign: tuple[str, ...]
) -> None:
    status, found = status_for_consumer({"phase": "Running", "hostIP": "10.9.9.9", **reported}, shape=StatusShape(),
                                        provider_pod_cidr="10.0.0.0/16", remapped_pod_cidr=remapped)  # fmt: skip
    assert (status["podIP"], status["podIPs"]) == (shown, [{"ip": shown}] if shown else None)
    assert found == foreign
    assert "hostIP" not in status  # a node of the provider's


def test_a_copy_that_reports_no_address_changes_none_on_the_consumer_pod() -> None:
    status, found = status_for_consumer({"phase": "Pending"}, shape=StatusShape(), provider_pod_cidr="10.0.0.0/16",
                                        remapped_pod_cidr="None")  # fmt: skip
    assert "podIP" not in status and "podIPs" not in status and found == ()


def test_the_foreign_address_warning_names_the_addresses_and_the_advertised_podcidr() -> None:
    message = foreign_ip_message((CONSUMER_API_SERVICE_IP,), provider_id="a", provider_pod_cidr="10.0.0.0/16")
    assert CONSUMER_API_SERVICE_IP in message and "10.0.0.0/16" in message and "provider a" in message


def test_a_services_copy_selects_this_consumers_copies_of_its_namespace_and_takes_its_own_address() -> None:
    service: dict[str, Any] = {"metadata": {"name": "web", "namespace": "shop", "uid": "u", "resourceVersion": "9"}, "spec": {
        "type": "NodePort", "selector": {"app": "web"}, "clusterIP": "10.96.0.7", "clusterIPs": ["10.96.0.7"],
        "ports": [{"port": 80, "targetPort": 8080, "nodePort": 30080, "protocol": "TCP"}],
        "sessionAffinity": "ClientIP"}}  # fmt: skip
    copy = service_copy(service, consumer_id="b")
    assert copy is not None
    assert copy["metadata"]["name"] == "web"  # its own name, in the namespace's remote namespace
    assert copy["metadata"]["labels"] == {"tidepool.io/offloaded": "true", "tidepool.io/consumer": "b",
                                          "tidepool.io/origin-namespace": "shop"}  # fmt: skip
    assert copy["spec"] == {"type": "ClusterIP", "selector": {"app": "web", "tidepool.io/consumer": "b",
                                                              "tidepool.io/origin-namespace": "shop"},
                            "ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}], "sessionAffinity": "ClientIP"}  # fmt: skip
    headless = service_copy({**service, "spec": {**service["spec"], "clusterIP": "None"}}, consumer_id="b")
    assert headless is not None and headless["spec"]["clusterIP"] == "None"
    # What the consumer's API server changes on its own (resourceVersion) is no change of the copy.
    again = service_copy({**service, "metadata": {**service["metadata"], "resourceVersion": "10"}}, consumer_id="b")
    assert again == copy
    edited = service_copy({**service, "spec": {**service["spec"], "ports": [{"port": 81}]}}, consumer_id="b")
    assert edited is not None and edited["metadata"]["annotations"] != copy["metadata"]["annotations"]


@pytest.mark.parametrize("spec", [
    pytest.param({"ports": [{"port": 80}]}, id="no selector: hand-made endpoints of the consumer's"),
    pytest.param({"type": "ExternalName", "externalName": "db.example.com", "selector": {"a": "b"}}, id="ExternalName"),
])  # fmt: skip
def test_services_whose_endpoints_are_not_pods_are_not_reflected(spec: dict[str, object]) -> None:
    assert service_copy({"metadata": {"name": "s", "namespace": "n"}, "spec": spec}, consumer_id="b") is None


def test_a_config_copy_carries_the_version_it_was_made_from() -> None:
    source = {"metadata": {"name": "db", "namespace": "shop", "resourceVersion": "41", "uid": "x"},
              "type": "kubernetes.io/basic-auth", "data": {"password": "cw=="}}  # fmt: skip
    copy = config_copy(source, kind="Secret", consumer_id="b")
    assert copy["metadata"]["name"] == "db" and copy["metadata"]["annotations"][ORIGIN_VERSION] == "41"
    assert (copy["type"], copy["data"]) == ("kubernetes.io/basic-auth", {"password": "cw=="})
    assert "uid" not in copy["metadata"]


def test_a_service_account_tokens_copy_is_opaque_data() -> None:
    """Of type service-account-token the provider refuses a consumer's Secret (models.enforcement), and its token
    controller would own it: the copy keeps the data as Opaque, so that pods mounting it by name still run."""
    source = {"metadata": {"name": "legacy", "namespace": "shop", "resourceVersion": "7",
                           "annotations": {"kubernetes.io/service-account.name": "builder"}},
              "type": "kubernetes.io/service-account-token", "data": {"token": "dA==", "ca.crt": "Yw=="}}  # fmt: skip
    copy = config_copy(source, kind="Secret", consumer_id="b")
    assert (copy["type"], copy["data"]) == ("Opaque", {"token": "dA==", "ca.crt": "Yw=="})
    assert not any(k.startswith("kubernetes.io/service-account.") for k in copy["metadata"]["annotations"])


@pytest.mark.parametrize(("policy", "action"), [("Always", "recreate"), ("OnFailure", "recreate"), (None, "recreate"),
                                                ("Never", "fail")])  # fmt: skip
def test_a_copy_lost_in_the_provider_is_made_again_only_for_a_pod_that_restarts(policy: str | None, action: str) -> None:
    assert when_copy_lost(policy) == action


def test_the_node_publishes_its_kubelet_endpoint_at_its_internal_ip_only() -> None:
    node = virtual_node(provider_id="a", resources={}, ready=True, reason="KubeletReady", message="", heartbeat="t",
                        transition="t", address="10.1.2.3", kubelet_port=10250)  # fmt: skip
    assert node["status"]["addresses"] == [{"type": "InternalIP", "address": "10.1.2.3"}]  # no unresolvable Hostname
    assert node["status"]["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 10250}}


# Namespace offloading (issue 35): the remote namespace a virtual kubelet asks for, what it reports, and when
# a copy of the single-namespace layout may go.
@pytest.mark.parametrize(("request_", "target"), [
    pytest.param(None, RemoteTarget("r", "Pending", "requested"), id="not answered yet: Pending"),
    pytest.param({"metadata": {"name": "r"}, "spec": {"consumerNamespace": "team"}},
                 RemoteTarget("r", "Pending", "requested"), id="created, no status yet: Pending"),
    pytest.param({"metadata": {"name": "r"}, "spec": {"consumerNamespace": "team"},
                  "status": {"phase": "Ready", "message": ""}}, RemoteTarget("r", "Ready", ""), id="Ready"),
    pytest.param({"metadata": {"name": "r"}, "spec": {"consumerNamespace": "team"},
                  "status": {"phase": "Refused", "message": "namespace r exists and is not yours"}},
                 RemoteTarget("r", "Refused", "namespace r exists and is not yours"), id="refused by the provider"),
    pytest.param({"metadata": {"name": "r"}, "spec": {"consumerNamespace": "team"}, "status": {"phase": "Odd"}},
                 RemoteTarget("r", "Pending", "requested"), id="a phase it does not know is Pending"),
    pytest.param({"metadata": {"name": "r"}, "spec": {"consumerNamespace": "other"}, "status": {"phase": "Ready"}},
                 RemoteTarget("r", "Refused", "remote namespace r is already requested for namespace other of this cluster"),
                 id="the name is another namespace's request: Refused"),
    pytest.param({"metadata": {"name": "r", "deletionTimestamp": "t"}, "spec": {"consumerNamespace": "team"},
                  "status": {"phase": "Ready"}}, RemoteTarget("r", "Deleting", "remote namespace r is being deleted"),
                 id="a former request going: Deleting"),
])  # fmt: skip
def test_a_remote_namespace_requests_phase_is_the_providers_word(request_: dict[str, Any] | None,
                                                                 target: RemoteTarget) -> None:  # fmt: skip
    assert remote_target(request_, remote="r", consumer_namespace="team") == target


def test_the_request_and_the_status_entry_name_the_namespaces() -> None:
    request = remote_namespace_request(remote="r", consumer_namespace="team", consumer_id="b")
    assert (request["kind"], request["metadata"]["name"], request["spec"]) == ("RemoteNamespace", "r",
                                                                               {"consumerNamespace": "team"})  # fmt: skip
    assert request["metadata"]["labels"]["tidepool.io/consumer"] == "b"
    entry = offloading_entry(provider_id="a", target=RemoteTarget("r", "Refused", "x" * 2000))
    assert entry["clusterId"] == "a" and entry["remoteNamespace"] == "r" and len(entry["message"]) == 1024
    OffloadingCluster.model_validate(entry)  # the CRD's shape


@pytest.mark.parametrize(("target", "offloaded", "says"), [
    pytest.param(None, False, "namespace team is not offloaded: run `tidepool offload namespace team`",
                 id="not offloaded: names the command"),
    pytest.param(None, True, "does not select provider a", id="offloaded elsewhere: the selector"),
    pytest.param(RemoteTarget("r", "Pending", "requested"), True, "remote namespace r of namespace team in provider a "
                 "is pending: requested", id="pending in the provider"),
    pytest.param(RemoteTarget("r", "Refused", "namespace r exists"), True,
                 "provider a refused remote namespace r for namespace team: namespace r exists",
                 id="refused: the provider's message"),
])  # fmt: skip
def test_a_pod_whose_namespace_is_not_ready_says_why(target: RemoteTarget | None, offloaded: bool, says: str) -> None:
    assert says in namespace_not_ready_message("team", provider_id="a", target=target, offloaded=offloaded)


RUNNING_READY = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}


@pytest.mark.parametrize(("status", "restart_policy", "may_go"), [
    pytest.param(RUNNING_READY, "Always", True, id="new copy Running and Ready: the old one goes"),
    pytest.param(RUNNING_READY, None, True, id="restartPolicy defaults to Always"),
    pytest.param({"phase": "Pending"}, "Always", False, id="new copy Pending: the old one stays"),
    pytest.param({"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}, "Always", False,
                 id="new copy Running, not Ready: the old one stays"),
    pytest.param(RUNNING_READY, "Never", False, id="a pod that runs to completion never moves"),
    pytest.param(RUNNING_READY, "OnFailure", False, id="nor one that restarts on failure only"),
])  # fmt: skip
def test_an_old_layouts_copy_goes_only_once_the_new_one_runs(status: dict[str, Any], restart_policy: str | None,
                                                             may_go: bool) -> None:  # fmt: skip
    assert legacy_copy_may_go(status, restart_policy=restart_policy) is may_go
    assert moves_to_remote_namespace(restart_policy) is (restart_policy in (None, "Always"))


def test_a_legacy_pod_copy_is_named_and_renamed_as_the_old_layout_did() -> None:
    pod = {"metadata": {"name": "web", "namespace": "shop", "uid": "u"}, "spec": SPEC}
    assert pod_copy(pod, consumer_id="b")["metadata"]["name"] == "web"
    legacy = pod_copy(pod, consumer_id="b", legacy=True)
    assert legacy["metadata"]["name"] == "shop-web"
    assert legacy["spec"]["volumes"][0]["configMap"]["name"] == "shop-settings"


def test_what_a_provider_says_of_a_remote_namespace_is_bounded_before_it_is_shown() -> None:
    """The provider writes the RemoteNamespace's status (and could rewrite its spec): its message reaches the
    NamespaceOffloading's entry, a pod's condition and an Event, each cut to a message's bound."""
    from models.pods import MAX_MESSAGE_CHARS
    from models.virtual_kubelet import namespace_not_ready_message, offloading_entry, remote_target

    refused = {"spec": {"consumerNamespace": "team"}, "status": {"phase": "Refused", "message": "x" * 100_000}}
    target = remote_target(refused, remote="team", consumer_namespace="team")
    assert target.phase == "Refused" and len(target.message) == MAX_MESSAGE_CHARS
    assert len(offloading_entry(provider_id="p", target=target)["message"]) == MAX_MESSAGE_CHARS
    said = namespace_not_ready_message("team", provider_id="p", target=target, offloaded=True)
    assert len(said) < MAX_MESSAGE_CHARS + 200
    other = remote_target({"spec": {"consumerNamespace": "y" * 100_000}}, remote="team", consumer_namespace="team")
    assert other.phase == "Refused" and len(other.message) < 2 * MAX_MESSAGE_CHARS


@pytest.mark.parametrize(("ttl", "declared", "grace"), [
    (1800, 30, 1800),  # production: the Advertisement's time to live
    (40, 30, 120),  # never sooner than 4 renewals
    (40, 10, 60),  # a consumer that renews every 10 s: 4 renewals, but never less than a minute
    (90, 10, 90),  # and the TTL when it is longer
    (40, 1, 60),  # one that says 1 s is held to the shortest renewal a virtual kubelet makes
    (40, 3600, 120),  # and one that says an hour to the longest: it cannot hold the provider's capacity longer
])  # fmt: skip
def test_a_silent_consumer_is_waited_for_its_ttl_or_four_renewals_of_the_period_its_keepalive_declares(
    ttl: int, declared: int, grace: int
) -> None:
    assert keepalive_grace(ttl, declared).total_seconds() == grace


def _keepalive(*, renewed: datetime, declared: int | None) -> k8s.V1Lease:
    return k8s.V1Lease.model_validate({
        "metadata": {"name": "tidepool-consumer-keepalive", "managedFields": [
            {"manager": "virtual-kubelet", "operation": "Update", "time": renewed.isoformat()}]},
        "spec": {"holderIdentity": "b", "renewTime": "1999-01-01T00:00:00.000000Z",  # the consumer's clock: unread
                 **({"leaseDurationSeconds": declared} if declared is not None else {})}})  # fmt: skip


@pytest.mark.parametrize(("declared", "silent_for", "lapsed"), [
    (10, 59, False), (10, 61, True),  # renewed every 10 s: a minute (4 renewals and the TTL are shorter)
    (30, 41, False), (30, 121, True),  # every 30 s (the default): 2 minutes
    (None, 119, False), (None, 121, True),  # a Lease that declares nothing: the default
])  # fmt: skip
def test_a_keepalive_lapses_after_the_grace_its_lease_declares_timed_by_the_server_s_clock(
    declared: int | None, silent_for: int, lapsed: bool
) -> None:
    now = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
    renewed = now - timedelta(seconds=silent_for)
    found = lapsed_since(_keepalive(renewed=renewed, declared=declared), time_to_live_seconds=40, now=now)
    assert found == (renewed if lapsed else None)
