"""A real node in a local cluster (deploy/localenv/realnode.py): a kubelet with containerd registers a Ready
node with this machine's capacity; a pod of a locally built image runs on it as a process, answers HTTP on
its pod IP, and `kubectl logs`, `exec` and `port-forward` reach it through the API server; a deleted pod
leaves no process in containerd. Then that cluster is a provider: a consumer's offloaded pod runs on the
real node as a process, reached from the consumer's kubectl. One cluster and one node for the module."""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from deploy.containers.images import pause_image, tidepool_image, workload_image
from deploy.localenv.binaries import Binaries, ensure_binaries, temporal_cli
from deploy.localenv.clusters import LocalCluster, create_cluster, delete_cluster, wait_for
from deploy.localenv.env import EnvState
from deploy.localenv.overlay import apply_overlay, write_overlay
from deploy.localenv.realnode import RealNode, start_real_node, stop_real_nodes
from deploy.localenv.temporal import TEST_DYNAMIC_CONFIG, start_temporal, stop_process_group
from kube.objects import ignore_not_found
from models.enforcement import QUOTA_NAME
from models.names import (
    LABEL_PROVIDER,
    SYSTEM_NAMESPACE,
    TAINT_VIRTUAL_NODE,
    foreign_namespace,
    virtual_kubelet_name,
    virtual_node_name,
    worker_lease_name,
)
from models.virtual_kubelet import PROVIDER_KUBECONFIG_DIR
from tests.kube import (
    apply_cluster_config,
    create_namespace,
    create_node,
    create_pod,
    delete_quietly,
    offload_namespace,
)
from tests.offload import offloaded_namespace, offloading_entry_of, peered, ready_node
from tests.rotation import force_rotation, held_kubeconfig, refused
from tests.running import eventually, running_worker, worker_settings
from workers.network import NetworkModule
from workers.peer import request_peering

pytestmark = [pytest.mark.env, pytest.mark.realnode]

CLUSTER, NODE = "realnode", "real-node"
WORKDIR_PREFIX, OWNER_FILE = "tidepool-realnode-", "owner.pid"
WORKLOAD_PORT = 8080  # Python's http.server in the workload image
CONSUMER_POD_CIDR = "10.2.0.0/16"
PUSH_PERIOD_SECONDS = 10  # the provider's, in the test of tidepool as pods: each periodic push checks the token
# A kubelet rewrites a pod's Secret volumes at its pod sync (syncFrequency, 1 min, plus jitter and its cache).
SECRET_VOLUME_UPDATE_SECONDS = 150
SYNC_FREQUENCY_SECONDS = 10


@dataclass(frozen=True)
class RealCluster:
    cluster: LocalCluster
    node: RealNode
    workload: str
    kubectl: Path

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.cluster.api_client())

    def object(self, model: Any) -> dict[str, Any]:
        """A client model as the API server's JSON."""
        found: dict[str, Any] = self.cluster.api_client().sanitize_for_serialization(model)
        return found

    def kubectl_run(self, *args: str) -> str:
        return subprocess.run([str(self.kubectl), "--kubeconfig", str(self.cluster.kubeconfig), *args],
                              check=True, capture_output=True, text=True, timeout=30).stdout  # fmt: skip


@dataclass(frozen=True)
class ReadyPod:
    name: str
    uid: str
    ip: str
    node: str


@pytest.fixture(scope="module")
def real() -> Iterator[RealCluster]:
    binaries = ensure_binaries()
    _remove_what_killed_runs_left(binaries)
    # Not under pytest's temporary directory: the kubelet's sockets in it would pass a Unix socket's 107 bytes.
    workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
    (workdir / OWNER_FILE).write_text(str(os.getpid()))
    try:
        cluster = create_cluster(CLUSTER, binaries=binaries, workdir=workdir)
        try:
            workload = workload_image()
            # The kubelet syncs its pods every 10 s, not every minute: a rotated Secret reaches a volume within
            # about 20 s instead of 1 to 2 minutes (78 s measured with the default: docs/peering.md).
            node = start_real_node(cluster, name=NODE, images=[workload], pause_image=pause_image(),
                                   sync_frequency_seconds=SYNC_FREQUENCY_SECONDS)  # fmt: skip
            try:
                yield RealCluster(cluster=cluster, node=node, workload=workload, kubectl=binaries.kubectl)
            finally:
                node.stop()
        finally:
            delete_cluster(cluster.name, binaries=binaries, workdir=workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _remove_what_killed_runs_left(binaries: Binaries) -> None:
    """A run killed before its teardown leaves its node's processes, containers and mounts, and its cluster:
    the next run removes them, as it does with containers (docs/development.md)."""
    for workdir in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):
        owner = workdir / OWNER_FILE
        if not owner.exists() or Path(f"/proc/{owner.read_text().strip()}").exists():
            continue  # still running (or just made)
        stop_real_nodes(workdir)
        delete_cluster(CLUSTER, binaries=binaries, workdir=workdir)
        shutil.rmtree(workdir, ignore_errors=True)


def _run_pod(real: RealCluster, name: str) -> ReadyPod:
    """A pod of the workload image, scheduled by the kube-scheduler onto the real node; waits until Ready."""
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "web", "image": real.workload, "imagePullPolicy": "Never",
                            "ports": [{"containerPort": WORKLOAD_PORT}],
                            # Running comes before Python listens: the kubelet's probe says when it does.
                            "readinessProbe": {"tcpSocket": {"port": WORKLOAD_PORT}, "periodSeconds": 1}}],
        },
    }  # fmt: skip
    real.core.create_namespaced_pod("default", k8s.V1Pod.model_validate(pod))

    def ready() -> ReadyPod | None:
        current = real.object(real.core.read_namespaced_pod(name, "default"))
        conditions = {c["type"]: c["status"] for c in current["status"].get("conditions") or []}
        if conditions.get("Ready") != "True":
            return None
        return ReadyPod(name=name, uid=current["metadata"]["uid"], ip=current["status"]["podIP"],
                        node=current["spec"]["nodeName"])  # fmt: skip

    pod_ready: ReadyPod = wait_for(ready, timeout=60, what=f"pod {name} to be Ready on {NODE}", interval=0.5)
    return pod_ready


@pytest.fixture(scope="module")
def web(real: RealCluster) -> Iterator[ReadyPod]:
    pod = _run_pod(real, "web")
    yield pod
    delete_quietly(real.core.delete_namespaced_pod, "web", "default", grace_period_seconds=0)


def _meminfo_kib(field: str) -> int:
    line = next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith(f"{field}:"))
    return int(line.split()[1])


def test_the_kubelet_registers_a_ready_node_with_this_machine_s_capacity(real: RealCluster) -> None:
    node = real.object(real.core.read_node(NODE))
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "True"
    assert node["status"]["capacity"]["cpu"] == str(os.cpu_count())
    assert node["status"]["capacity"]["memory"] == f"{_meminfo_kib('MemTotal')}Ki"
    assert {a["type"]: a["address"] for a in node["status"]["addresses"]}["InternalIP"] == real.node.node_ip
    assert not ip_address(real.node.node_ip).is_loopback  # the API server dials it for logs and exec
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert "kwok.x-k8s.io/node" not in node["metadata"].get("annotations", {})  # not a fake: kwok leaves it alone


def test_a_pod_of_a_local_image_runs_as_a_process_and_answers_http_on_its_pod_ip(
    real: RealCluster, web: ReadyPod
) -> None:
    assert web.node == NODE
    assert ip_address(web.ip) in ip_network(real.node.pod_cidr)
    with urllib.request.urlopen(f"http://{web.ip}:{WORKLOAD_PORT}/", timeout=5) as response:
        assert response.read().decode().strip() == "served by a real node"


def test_kubectl_logs_exec_and_port_forward_reach_the_pod_through_the_api_server(
    real: RealCluster, web: ReadyPod
) -> None:
    with urllib.request.urlopen(f"http://{web.ip}:{WORKLOAD_PORT}/?from=the-test", timeout=5) as response:
        response.read()
    # http.server logs each request on stderr: the container's log, read by the kubelet for the API server.
    wait_for(lambda: '"GET /?from=the-test HTTP/1.1" 200' in real.kubectl_run("logs", "web"), timeout=10,
             what="the request in kubectl logs")  # fmt: skip
    assert real.kubectl_run("exec", "web", "--", "cat", "/etc/hostname").strip() == "web"
    assert real.kubectl_run("exec", "web", "--", "cat", "/srv/www/index.html").strip() == "served by a real node"
    forward = subprocess.Popen([str(real.kubectl), "--kubeconfig", str(real.cluster.kubeconfig), "port-forward",
                                "pod/web", f":{WORKLOAD_PORT}"], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert forward.stdout is not None
        readable, _, _ = select.select([forward.stdout], [], [], 20)
        listening = re.search(r"127\.0\.0\.1:(\d+)", forward.stdout.readline() if readable else "")
        assert listening, "kubectl port-forward said nowhere it listens"
        with urllib.request.urlopen(f"http://127.0.0.1:{listening[1]}/", timeout=5) as response:
            assert response.read().decode().strip() == "served by a real node"
    finally:
        forward.terminate()
        forward.wait(timeout=10)


def test_a_deleted_pod_leaves_no_process_in_containerd(real: RealCluster) -> None:
    uid = _run_pod(real, "short-lived").uid
    assert len(real.node.containers(pod_uid=uid)) == 2  # its sandbox (pause) and its container
    assert len(real.node.running(pod_uid=uid)) == 2
    real.core.delete_namespaced_pod("short-lived", "default")
    wait_for(lambda: _gone(real, "short-lived"), timeout=30, what="the pod to be deleted")
    # The kubelet stops the processes as the pod goes; it removes the stopped containers at its next garbage
    # collection (every minute), which is the kubelet's own business.
    wait_for(lambda: real.node.running(pod_uid=uid) == [], timeout=15, what="no process of it running", interval=1)


def _gone(real: RealCluster, name: str) -> bool:
    try:
        real.core.read_namespaced_pod(name, "default")
    except k8s.ApiException as e:
        return bool(e.status == 404)
    return False


# Small amounts of whatever the offer's quota counts in the provider (a pod must request each of them).
SMALL_REQUESTS = {"cpu": "100m", "memory": "64Mi", "ephemeral-storage": "64Mi"}


async def test_an_offloaded_pod_is_a_process_on_the_providers_real_node_and_kubectl_reaches_it_from_the_consumer(
    real: RealCluster, localenv: EnvState, make_cluster: Callable[[str], LocalCluster], unique: str, tmp_path: Path,
) -> None:
    """The real node's cluster is the provider. A consumer pod on its virtual node becomes a copy that the
    provider's scheduler puts on the real node; the consumer sees the copy's own IP (no remapping: the
    PodCIDRs do not overlap), and kubectl on the consumer reaches the process through the virtual kubelet's
    kubelet API, the provider's API server and the real kubelet."""
    async with peered(localenv, make_cluster, unique, provider=real.cluster, provider_pod_cidr=real.node.pod_cidr,
                      consumer_pod_cidr="10.2.0.0/16", log_dir=tmp_path) as peering:  # fmt: skip
        consumer = k8s.CoreV1Api(peering.consumer.api_client())
        await eventually(lambda: ready_node(consumer, peering.node), timeout=90, what="the virtual node Ready")
        remote = await offloaded_namespace(peering, "shop")
        counted = real.core.read_namespaced_resource_quota(QUOTA_NAME, remote).spec.hard or {}
        requests = {name: amount for name, amount in SMALL_REQUESTS.items() if f"requests.{name}" in counted}
        consumer.create_namespaced_pod("shop", k8s.V1Pod.model_validate({"metadata": {"name": "web"}, "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "web", "image": real.workload, "imagePullPolicy": "Never",
                            "ports": [{"containerPort": WORKLOAD_PORT}], "resources": {"requests": requests}}],
            "tolerations": [{"key": TAINT_VIRTUAL_NODE, "operator": "Exists", "effect": "NoExecute"}],
            "nodeSelector": {LABEL_PROVIDER: peering.provider_id}}}))  # fmt: skip
        pod = await eventually(lambda: (p := consumer.read_namespaced_pod("web", "shop")).status.pod_ip and p,
                               timeout=90, what="the offloaded pod's IP")  # fmt: skip
        copy = real.core.read_namespaced_pod("web", remote)
        assert copy.spec.node_name == NODE and pod.spec.node_name == peering.node
        assert pod.status.pod_ip == copy.status.pod_ip and ip_address(pod.status.pod_ip) in ip_network(real.node.pod_cidr)
        assert len(real.node.running(pod_uid=str(copy.metadata.uid))) == 2  # its sandbox and its container

        def get(path: str) -> str:
            with urllib.request.urlopen(f"http://{pod.status.pod_ip}:{WORKLOAD_PORT}{path}", timeout=5) as response:
                return str(response.read().decode().strip())

        assert await eventually(lambda: get("/?from=the-consumer"), what="the process to answer") == \
            "served by a real node"  # fmt: skip

        def kubectl(*args: str) -> str:
            return subprocess.run([str(real.kubectl), "--kubeconfig", str(peering.consumer.kubeconfig), "-n", "shop",
                                   *args], check=True, capture_output=True, text=True, timeout=30).stdout  # fmt: skip

        await eventually(lambda: '"GET /?from=the-consumer HTTP/1.1" 200' in kubectl("logs", "web"), timeout=15,
                         what="the request in kubectl logs on the consumer")  # fmt: skip
        assert kubectl("exec", "web", "--", "cat", "/etc/hostname").strip() == "web"
        assert kubectl("exec", "web", "--", "cat", "/srv/www/index.html").strip() == "served by a real node"


async def test_tidepool_runs_as_pods_of_its_image_installed_from_deploy_and_its_virtual_kubelet_serves_kubectl(
    real: RealCluster, localenv: EnvState, make_cluster: Callable[[str], LocalCluster], unique: str, tmp_path: Path,
) -> None:
    """The real node's cluster is a consumer now, with tidepool installed as users install it: deploy/base
    through a local overlay (deploy/localenv/overlay.py), its worker a pod of tidepool's image under the real
    kubelet, in-cluster (its ServiceAccount's projected token, the `kubernetes` Service). That worker makes the
    virtual kubelet's Deployment; the real kubelet runs it too: the provider's kubeconfig from its Secret
    volume, a read-only root, its kubelet API on its pod IP, which the node it registers gives as InternalIP
    and through which kubectl on this cluster reaches a pod's copy in the provider."""
    image = tidepool_image()
    real.node.import_image(image)
    # A Temporal of its own, a process on loopback as the demo's is (the environment's runs in a container, whose
    # published port a pod's NATed connection does not reach).
    temporal = start_temporal(cli=temporal_cli(), namespaces=[], log_file=tmp_path / "temporal.log", headless=True,
                              dynamic_config=TEST_DYNAMIC_CONFIG)  # fmt: skip
    try:
        await _consume_with_tidepool_as_pods(real, localenv, make_cluster, unique, tmp_path, image=image,
                                             temporal_address=temporal.address)  # fmt: skip
    finally:
        stop_process_group(temporal.pid)


async def _consume_with_tidepool_as_pods(real: RealCluster, localenv: EnvState,
                                         make_cluster: Callable[[str], LocalCluster], unique: str, tmp_path: Path, *,
                                         image: str, temporal_address: str) -> None:  # fmt: skip
    host, temporal_port = real.node.node_ip, temporal_address.rsplit(":", 1)[1]
    provider = make_cluster("prov")
    create_node(provider.api_client(), "big", cpu="8", memory="16Gi")
    apply_cluster_config(provider.api_client(), outgoing={"sharingPercentage": 50,
                                                          "advertisementPeriodSeconds": PUSH_PERIOD_SECONDS})  # fmt: skip
    provider_id, consumer_id = f"prov-{unique}", f"real-{unique}"
    # This machine's address, not loopback: the virtual kubelet dials it from its pod.
    settings = worker_settings(localenv, provider, provider_id, temporal_address=temporal_address)
    settings = settings.model_copy(update={"cluster": settings.cluster.model_copy(
        update={"api_server_for_peers": f"https://{host}:{provider.api_server_port}"})})  # fmt: skip
    overlay = write_overlay(tmp_path / "overlay", image=image, settings={
        "TIDEPOOL_CLUSTER_CLUSTER_ID": consumer_id, "TIDEPOOL_CLUSTER_POD_CIDR": CONSUMER_POD_CIDR,
        "TIDEPOOL_TEMPORAL_ADDRESS": f"{host}:{temporal_port}", "TIDEPOOL_TEMPORAL_NAMESPACE": "default"})  # fmt: skip
    apply_overlay(overlay, kubeconfig=real.cluster.kubeconfig, binaries=ensure_binaries())
    apps = k8s.AppsV1Api(real.cluster.api_client())

    def available(name: str) -> bool:
        deployment = ignore_not_found(apps.read_namespaced_deployment, name, SYSTEM_NAMESPACE)
        return deployment is not None and (deployment.status.available_replicas or 0) >= 1

    network = NetworkModule(real.cluster.api_client(), local_pod_cidr=CONSUMER_POD_CIDR).start()
    try:
        # Its Lease held by its pod: connected to Temporal and to its API server, its watchers running.
        await eventually(lambda: (held := ignore_not_found(k8s.CoordinationV1Api(real.cluster.api_client())
                                                          .read_namespaced_lease, worker_lease_name(consumer_id),
                                                          SYSTEM_NAMESPACE)) is not None
                         and (held.spec.holder_identity or "").startswith("tidepool-worker-"),
                         timeout=120, what="the worker's pod leading")  # fmt: skip
        # Ready by its /readyz (workers/health.py): connected to Temporal and serving.
        await eventually(lambda: available("tidepool-worker"), timeout=60, what="the worker's pod Ready")
        async with running_worker(settings):
            request_peering(provider.api_client(), real.cluster.api_client(), provider_id=provider_id,
                            consumer_id=consumer_id)  # fmt: skip
            vk = virtual_kubelet_name(provider_id)
            await eventually(lambda: available(vk), timeout=120, what="the virtual kubelet's pod Ready")
            pod = real.core.list_namespaced_pod(SYSTEM_NAMESPACE, label_selector=f"{LABEL_PROVIDER}={provider_id}").items[0]
            assert pod.spec.node_name == NODE and len(real.node.running(pod_uid=str(pod.metadata.uid))) == 2
            node = await eventually(lambda: ready_node(real.core, virtual_node_name(provider_id)), timeout=90,
                                    what="the virtual node Ready")  # fmt: skip
            assert {a.type: a.address for a in node.status.addresses}["InternalIP"] == pod.status.pod_ip

            create_namespace(real.cluster.api_client(), "shop")
            offload_namespace(real.cluster.api_client(), "shop")
            await eventually(lambda: (offloading_entry_of(real.cluster.api_client(), "shop", provider_id) or {})
                             .get("phase") == "Ready", timeout=60, what="shop's remote namespace Ready")  # fmt: skip
            create_pod(real.cluster.api_client(), "shop", "web", requests={"cpu": "100m"},
                       node_selector={LABEL_PROVIDER: provider_id},
                       tolerations=[{"key": TAINT_VIRTUAL_NODE, "operator": "Exists", "effect": "NoExecute"}])  # fmt: skip
            await eventually(lambda: real.core.read_namespaced_pod("web", "shop").status.phase == "Running",
                             timeout=90, what="the offloaded pod Running")  # fmt: skip
            # The API server dials the virtual kubelet's pod; it reads the copy's log from the provider (kwok's).
            logs = real.kubectl_run("logs", "-n", "shop", "web")
            assert f"fake pod of cluster {provider.name} started" in logs
            await _a_rotation_reaches_the_virtual_kubelet_through_its_secret_volume(
                real, provider, provider_id=provider_id, consumer_id=consumer_id, pod=str(pod.metadata.name))  # fmt: skip
    except BaseException:
        print(_what_tidepool_says(real))  # in the failure's report
        raise
    finally:
        network.stop()
        delete_quietly(apps.delete_namespaced_deployment, "tidepool-worker", SYSTEM_NAMESPACE)


async def _a_rotation_reaches_the_virtual_kubelet_through_its_secret_volume(
    real: RealCluster, provider: LocalCluster, *, provider_id: str, consumer_id: str, pod: str,
) -> None:  # fmt: skip
    """The consumer's worker writes a renewed kubeconfig into the Secret; the kubelet, not tidepool, updates
    the virtual kubelet's volume (at its own pace: its pod sync, every SYNC_FREQUENCY_SECONDS here, a minute by
    default), and the virtual
    kubelet reloads the file. Once the provider revokes the token it started with, it works on, unrestarted."""
    consumer = real.cluster.api_client()

    def mounted() -> str:
        return real.kubectl_run("exec", "-n", SYSTEM_NAMESPACE, pod, "--", "cat", f"{PROVIDER_KUBECONFIG_DIR}/kubeconfig")

    first = held_kubeconfig(consumer, provider_id)
    assert mounted() == first
    await force_rotation(provider.api_client(), consumer_id, period_seconds=PUSH_PERIOD_SECONDS)
    second = held_kubeconfig(consumer, provider_id)
    assert second != first
    written = time.monotonic()
    await eventually(lambda: mounted() == second, timeout=SECRET_VOLUME_UPDATE_SECONDS, interval=5,
                     what="the kubelet to update the virtual kubelet's Secret volume")  # fmt: skip
    print(f"the kubelet's Secret volume followed the Secret {time.monotonic() - written:.0f} s after it changed")
    # A second rotation revokes the first token (the previous one stays valid for a slow reader).
    await force_rotation(provider.api_client(), consumer_id, period_seconds=PUSH_PERIOD_SECONDS)
    # Asked from here, where the provider's API server listens on loopback (its pods' address is NATed there).
    first_from_here = first.replace(f"https://{real.node.node_ip}:", "https://127.0.0.1:")
    assert first_from_here != first
    await eventually(lambda: refused(first_from_here, foreign_namespace(consumer_id)), timeout=30,
                     what="the first token refused by the provider's API server")  # fmt: skip
    create_pod(consumer, "shop", "after", requests={"cpu": "100m"}, node_selector={LABEL_PROVIDER: provider_id},
               tolerations=[{"key": TAINT_VIRTUAL_NODE, "operator": "Exists", "effect": "NoExecute"}])  # fmt: skip
    await eventually(lambda: real.core.read_namespaced_pod("after", "shop").status.phase == "Running",
                     timeout=60, what="a pod created after the revocation Running through the provider")  # fmt: skip
    assert f"fake pod of cluster {provider.name} started" in real.kubectl_run("logs", "-n", "shop", "after")
    statuses = real.core.read_namespaced_pod(pod, SYSTEM_NAMESPACE).status.container_statuses or []
    assert [s.restart_count for s in statuses] == [0]  # the same process, which reloaded its file


def _what_tidepool_says(real: RealCluster) -> str:
    """tidepool's pods on the cluster, their Events and their logs' last lines."""
    said = []
    for args in (("get", "pods", "-A", "-o", "wide"), ("get", "events", "-n", SYSTEM_NAMESPACE),
                 ("logs", "-n", SYSTEM_NAMESPACE, "-l", "app.kubernetes.io/name=tidepool-worker", "--tail=30"),
                 ("logs", "-n", SYSTEM_NAMESPACE, "-l", LABEL_PROVIDER, "--tail=30")):  # fmt: skip
        shown = subprocess.run([str(real.kubectl), "--kubeconfig", str(real.cluster.kubeconfig), *args],
                               capture_output=True, text=True, timeout=30)  # fmt: skip
        said.append(f"$ kubectl {' '.join(args)}\n{shown.stdout}{shown.stderr}")
    return "\n".join(said)
