"""The demo: `make demo` (python -m deploy.localenv.demo up) runs the main job on the local environment.

It brings up Temporal with its Web UI and clusters a, b, c, d, tenant and tenant2 with fake nodes, and two
real nodes (deploy/localenv/realnode.py: a kubelet with containerd): b's system node, tainted for tidepool
alone, and d's only node. tidepool runs in b as users install it: deploy/base through a local overlay, its
worker and its virtual kubelets pods of tidepool's image on b's system node. a, c and d run a worker, a
network module and a kubelet stand-in each as local processes (each cluster on its own task queue and
Temporal namespace). b consumes from a, c and d, which share different percentages; it offloads the
namespace `shop` (`tidepool offload namespace shop`), runs a pod there on d's virtual node, which is a real
process on d's real node that `kubectl exec` on b reaches, and deploys a sample workload of which some pods
run on the virtual nodes, i.e. in a and c (each in a namespace of its own there), behind a Service whose
EndpointSlice addresses it prints (each cluster's pods have IPs of its own PodCIDR; a and c share one, so b
remaps one of them). Then it runs the super cluster pool quick start (two tenants, each with a namespace
team-red whose quota is placed as slices across a, b and c, and a pod running in its super cluster), and
prints a table. Everything keeps running for exploring; `make demo-down` (python -m deploy.localenv.demo
down) stops it all. Real nodes need root (containerd, iptables): `real_nodes=False` (bench/soak.py) runs
b's tidepool as processes too and leaves d out.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from deploy.containers.images import pause_image, tidepool_image, workload_image
from deploy.localenv.binaries import ensure_binaries
from deploy.localenv.clusters import fake_node, join_pool, node_pod_cidrs
from deploy.localenv.env import (
    DEFAULT_STATE_DIR,
    EnvState,
    down,
    temporal_namespace,
    up,
)
from deploy.localenv.overlay import apply_overlay, write_overlay
from deploy.localenv.realnode import RealNode, start_real_node
from deploy.localenv.temporal import free_port, stop_process_group
from kube.clients import client_from_own_kubeconfig_file
from kube.objects import apply_cluster_object, list_cluster_objects, read_cluster_object
from kube.tenant_identity import add_tenant
from models.names import (
    ADVERTISEMENTS,
    API_VERSION,
    CLUSTER_CONFIG_NAME,
    CLUSTER_CONFIGS,
    LABEL_NODE_TYPE,
    LABEL_PROVIDER,
    PLACEMENTS_ANNOTATION,
    SYSTEM_NAMESPACE,
    VIRTUAL_NODE_TYPE,
    advertisement_name,
    virtual_kubelet_name,
    virtual_node_name,
    worker_lease_name,
)
from models.network import NO_REMAPPING
from models.settings import MetricsSettings, VirtualKubeletSettings
from workers.cli import POOL_WORKER, named_clusters, status
from workers.metrics import METRICS_LINE
from workers.peer import request_peering

CLUSTERS = ["a", "b", "c", "d", "tenant", "tenant2"]
PEER_CLUSTERS = ["a", "b", "c", "d"]
CONSUMER = "b"
TENANT_CLUSTERS = ["tenant", "tenant2"]
SUPER_CLUSTERS = ["a", "b", "c"]
REAL_PROVIDER = "d"  # its only node is a real one: a cluster of the demo only with real nodes
# Each provider shares a different part of what it has.
SHARING = {"a": 40, "b": 30, "c": 60, "d": 50}
# What each worker advertises and its network module keeps clear of, and the blocks its nodes' pods get
# (node_pod_cidrs). c overlaps a: b's network module remaps whichever it decides for second. d's is its
# real node's block, known once the node has one.
POD_CIDRS = {"a": "10.1.0.0/16", "b": "10.2.0.0/16", "c": "10.1.0.0/16"}
NODES = {"a": [("a-node-1", "8", "32Gi"), ("a-node-2", "8", "32Gi")],
         "b": [("b-node-1", "4", "8Gi")],
         "c": [("c-node-1", "16", "64Gi")],
         "d": [], "tenant": [], "tenant2": []}  # fmt: skip
REPLICAS = 6
# b's system node: a real node for tidepool's pods alone, as a user keeps one for system components; the
# sample workload, which tolerates nothing, stays off it.
SYSTEM_NODE = "b-system"
SYSTEM_TAINT = {"key": "dedicated", "value": "system", "effect": "NoSchedule"}
REAL_PROVIDER_NODE = "d-node"
HELLO = "hello"  # b's pod on d's virtual node: a process on d's real node


def say(message: str) -> None:
    print(f"==> {message}", flush=True)


def _metrics_port(index: int, *, persistent: bool) -> int:
    """The demo's well-known ports; a private run (bench/soak.py) beside it takes free ones."""
    return 9464 + index if persistent else free_port()


def _env(state: EnvState, cluster: str, *, pod_cidr: str, persistent: bool, extra: dict[str, str],
         peers_dial: str | None) -> dict[str, str]:  # fmt: skip
    """A local process's environment for `cluster`; `peers_dial` is the address that other clusters' pods
    reach this machine at (a real node's pods do not reach its loopback), None when no pod dials it."""
    env = dict(os.environ, **extra)
    env.update({
        "TIDEPOOL_CLUSTER_CLUSTER_ID": f"cluster-{cluster}",
        "TIDEPOOL_CLUSTER_KUBECONFIG": state.kubeconfigs[cluster],
        "TIDEPOOL_CLUSTER_POD_CIDR": pod_cidr,
        "TIDEPOOL_TEMPORAL_ADDRESS": state.temporal_address,
        "TIDEPOOL_TEMPORAL_NAMESPACE": temporal_namespace(cluster),
        "TIDEPOOL_METRICS_PORT": str(_metrics_port(PEER_CLUSTERS.index(cluster), persistent=persistent)),
        "TIDEPOOL_HEALTH_PORT": "0",  # probes are for a kubelet; several workers share this machine
    })  # fmt: skip
    if peers_dial:
        env["TIDEPOOL_CLUSTER_API_SERVER_FOR_PEERS"] = f"https://{peers_dial}:{state.cluster(cluster).api_server_port}"
    return env


def _spawn(state: EnvState, pids: dict[str, int], name: str, command: list[str], env: dict[str, str]) -> None:
    """Starts `command` in its own session and records it at once, so that a bring-up interrupted half-way
    leaves nothing that `tear_down` does not know of."""
    log = Path(state.state_dir) / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        process = subprocess.Popen([sys.executable, *command], env=env, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    pids[name] = process.pid
    _processes_file(state).write_text(json.dumps(pids, indent=2))


def _processes_file(state: EnvState) -> Path:
    return Path(state.state_dir) / "processes.json"


def _wait(what: str, predicate: Any, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            result = predicate()
            if result:
                return result
        except Exception:  # noqa: BLE001 - the demo waits through transient errors
            pass
        time.sleep(1)
    raise TimeoutError(f"the demo timed out waiting for {what}")


def bring_up(state_dir: Path, *, persistent: bool = True, worker_env: dict[str, str] | None = None,
             real_nodes: bool = True) -> EnvState:  # fmt: skip
    """The demo, in `state_dir`. `persistent` is `make demo` (a database file, the Web UI on 8233, metrics on
    9464-9468); otherwise everything in memory on free ports, beside a running demo (bench/soak.py).
    `worker_env` is added to the environment of every process started (workers, kubelet stand-ins, syncers).
    `real_nodes` runs b's tidepool as pods on a real node and adds d (module docstring)."""
    started = time.monotonic()
    extra = dict(worker_env or {})
    clusters = CLUSTERS if real_nodes else [c for c in CLUSTERS if c != REAL_PROVIDER]
    peers = [c for c in PEER_CLUSTERS if c in clusters]
    providers = [c for c in peers if c != CONSUMER]
    say(f"starting Temporal{' (Web UI on http://127.0.0.1:8233)' if persistent else ''} and clusters {', '.join(clusters)}")
    # The tenants' control planes run no kube-scheduler: the pool schedules their pods (docs/pool.md).
    state = up(clusters=clusters, without_scheduler=TENANT_CLUSTERS, state_dir=state_dir, persistent=persistent)
    pod_cidrs = dict(POD_CIDRS)
    real: dict[str, RealNode] = {}
    if real_nodes:
        say(f"starting real nodes (a kubelet with containerd each): {SYSTEM_NODE} in b, for tidepool's pods, and "
            f"{REAL_PROVIDER_NODE}, d's only node")  # fmt: skip
        real = _start_real_nodes(state)
        pod_cidrs[REAL_PROVIDER] = real[REAL_PROVIDER].pod_cidr
    apis = {name: client_from_own_kubeconfig_file(state.kubeconfigs[name]) for name in clusters}

    say("adding fake nodes and ClusterConfigs")
    for name in clusters:
        nodes = NODES[name]
        blocks = node_pod_cidrs(pod_cidrs[name], len(nodes)) if nodes else []
        for (node, cpu, memory), block in zip(nodes, blocks, strict=True):
            body = fake_node(node, cpu=cpu, memory=memory, pod_cidr=block)
            k8s.CoreV1Api(apis[name]).create_node(k8s.V1Node.model_validate(body))
    for name in peers:  # SYSTEM_NAMESPACE is there: created with the CRDs (clusters.install_crds)
        apply_cluster_object(apis[name], CLUSTER_CONFIGS, {
            "apiVersion": API_VERSION, "kind": "ClusterConfig", "metadata": {"name": CLUSTER_CONFIG_NAME},
            "spec": {"outgoing": {"sharingPercentage": SHARING[name]},
                     "incoming": {"acceptPolicy": "AutoAcceptMax", "maxAcceptableAdvertisements": 5}},
        })  # fmt: skip

    pids: dict[str, int] = {}
    # A real node's pods reach this machine at its address, never at its loopback (realnode.py).
    host = real[CONSUMER].node_ip if real_nodes else None
    for name in peers:
        env = _env(state, name, pod_cidr=pod_cidrs[name], persistent=persistent, extra=extra, peers_dial=host)
        state.record_worker(cluster_id=env["TIDEPOOL_CLUSTER_CLUSTER_ID"], namespace=env["TIDEPOOL_TEMPORAL_NAMESPACE"],
                            cluster=name)  # fmt: skip
        _spawn(state, pids, f"network-{name}", ["-m", "workers.network"], env)
        if name == CONSUMER and real_nodes:
            say(f"installing tidepool in b from deploy/base (a local overlay): its worker a pod on {SYSTEM_NODE}")
            _install_as_pods(state, name, host=host or "", pod_cidr=pod_cidrs[name], extra=extra)
            continue
        say(f"starting {name}'s worker, network module and kubelet stand-in as local processes")
        _spawn(state, pids, f"worker-{name}", ["-m", "workers.cluster"], env)
        _spawn(state, pids, f"kubelet-{name}", [
            "-m", "deploy.localenv.deployments", "--kubeconfig", state.kubeconfigs[name],
            "--log-dir", str(Path(state.state_dir) / "logs")], env)
    if real_nodes:
        _wait("b's worker pod leading (its Lease)", lambda: _worker_pod_leads(apis[CONSUMER]), timeout=180)

    say(f"b asks {' and '.join(providers)} for resources (PeeringRequests)")
    for provider in providers:
        request_peering(apis[provider], apis[CONSUMER], provider_id=f"cluster-{provider}", consumer_id="cluster-b")
    core_b = k8s.CoreV1Api(apis[CONSUMER])

    def virtual_nodes_ready() -> bool:
        nodes = core_b.list_node(label_selector=f"{LABEL_NODE_TYPE}={VIRTUAL_NODE_TYPE}").items
        return len(nodes) == len(providers) and _all_ready(nodes)

    _wait(f"{len(providers)} Accepted Advertisements on b", lambda: sum(
        (a.get("status") or {}).get("phase") == "Accepted"
        for a in list_cluster_objects(apis[CONSUMER], ADVERTISEMENTS)
    ) == len(providers))  # fmt: skip
    say("Advertisements accepted; waiting for the virtual nodes")
    _wait(f"{len(providers)} Ready virtual nodes on b", virtual_nodes_ready, timeout=180)
    if real_nodes:  # the worker and a virtual kubelet per provider, pods on b's system node
        _wait("tidepool's pods on b Ready", lambda: _all_ready(core_b.list_namespaced_pod(SYSTEM_NAMESPACE).items))
        _show(state, CONSUMER, "-n", SYSTEM_NAMESPACE, "get", "pods", "-o", "wide")

    core_b.create_namespace(k8s.V1Namespace.model_validate({"metadata": {"name": "shop"}}))
    # As a user would: the namespace is offloaded (to every provider, pods local and remote), and its pods get
    # the virtual nodes' toleration at admission; a namespace not offloaded never reaches a virtual node.
    offload = [sys.executable, "-m", "workers.cli", "offload", "namespace", "shop", "--wait",
               "--kubeconfig", state.kubeconfigs[CONSUMER]]  # fmt: skip
    say(f"$ tidepool offload namespace shop --wait --kubeconfig {state.kubeconfigs[CONSUMER]}")
    subprocess.run(offload, check=True, timeout=180)
    # The workload image: an HTTP server on 8080, a real process where a real node runs it, a fake on kwok's.
    image = workload_image() if real_nodes else "nginx"
    if real_nodes:
        _hello_from_the_real_provider(state, core_b, image=image)
    say(f"deploying a sample workload in b: {REPLICAS} pods, of which the ones that do not fit on b's own node run "
        "in its providers")  # fmt: skip
    k8s.AppsV1Api(apis[CONSUMER]).create_namespaced_deployment("shop", k8s.V1Deployment.model_validate({
        "metadata": {"name": "web"},
        "spec": {"replicas": REPLICAS, "selector": {"matchLabels": {"app": "web"}}, "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": image, "imagePullPolicy": "IfNotPresent",
                                     "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}},
    }))  # fmt: skip
    _wait("the sample workload Running", lambda: sum(
        _phase(p) == "Running" for p in core_b.list_namespaced_pod("shop", label_selector="app=web").items) == REPLICAS,
        timeout=180)  # fmt: skip
    core_b.create_namespaced_service("shop", k8s.V1Service.model_validate({"metadata": {"name": "web"}, "spec": {
        "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}))  # fmt: skip
    endpoints = _wait(f"the Service's EndpointSlices listing {REPLICAS} replicas at distinct addresses",
                      lambda: _distinct_endpoints(apis[CONSUMER], "shop", "web", count=REPLICAS), timeout=60)
    say("the Service shop/web on b, its EndpointSlice addresses (local and offloaded replicas):")
    print(_endpoints_table(apis[CONSUMER], endpoints, pod_cidrs=pod_cidrs), flush=True)

    say("super cluster pool: a, b and c join the pool of two tenants (tenant, tenant2); their namespaces get quota slices")
    pool_env = dict(os.environ, **extra, TIDEPOOL_CLUSTER_CLUSTER_ID=POOL_WORKER, TIDEPOOL_CLUSTER_KUBECONFIG=state.kubeconfigs["tenant"],
                    TIDEPOOL_TEMPORAL_ADDRESS=state.temporal_address,
                    TIDEPOOL_TEMPORAL_NAMESPACE=temporal_namespace("tenant"),
                    TIDEPOOL_METRICS_PORT=str(_metrics_port(len(peers), persistent=persistent)),
                    TIDEPOOL_HEALTH_PORT="0")  # fmt: skip
    core_t = k8s.CoreV1Api(apis["tenant"])
    # The tenant's control plane is the pool's management cluster too: its Tenant, SuperClusters and settings.
    add_tenant(apis["tenant"], apis["tenant"], "tenant")
    add_tenant(apis["tenant"], apis["tenant2"], "tenant2")
    for name in SUPER_CLUSTERS:  # a SuperCluster by its cluster id, as `tidepool status` names the cluster
        super_cluster = state.cluster_ids[name]
        join_pool(apis["tenant"], super_cluster, Path(state.kubeconfigs[name]), headroom={"cpu": "1", "memory": "2Gi"})
        _spawn(state, pids, f"syncer-{name}", [
            "-m", "workers.syncer", "--management-kubeconfig", state.kubeconfigs["tenant"],
            "--super-kubeconfig", state.kubeconfigs[name], "--cluster", super_cluster,
            "--kubelet-port", str(free_port())], pool_env)  # every tenant's nodes of it say this one port
    _spawn(state, pids, "pool-scheduler", ["-m", "workers.pool"], pool_env)
    state.record_worker(cluster_id=POOL_WORKER, namespace=pool_env["TIDEPOOL_TEMPORAL_NAMESPACE"])
    for team, cpu, memory in (("team-red", "6", "12Gi"), ("team-blue", "3", "6Gi")):
        core_t.create_namespace(k8s.V1Namespace.model_validate({"metadata": {"name": team}}))
        core_t.create_namespaced_resource_quota(team, k8s.V1ResourceQuota.model_validate({"metadata": {"name": "quota"},
                                                       "spec": {"hard": {"cpu": cpu, "memory": memory}}}))
    _wait("the tenant namespaces placed", lambda: all(
        PLACEMENTS_ANNOTATION in ((core_t.read_namespace(t).metadata or k8s.V1ObjectMeta()).annotations or {})
        for t in ("team-red", "team-blue")))
    # The second tenant has a team-red of its own: same name, its own namespace in the super clusters.
    core_t2 = k8s.CoreV1Api(apis["tenant2"])
    core_t2.create_namespace(k8s.V1Namespace.model_validate({"metadata": {"name": "team-red"}}))
    core_t2.create_namespaced_resource_quota("team-red", k8s.V1ResourceQuota.model_validate({
        "metadata": {"name": "quota"}, "spec": {"hard": {"cpu": "2", "memory": "4Gi"}}}))  # fmt: skip
    for core in (core_t, core_t2):
        core.create_namespaced_pod("team-red", k8s.V1Pod.model_validate({"metadata": {"name": "api"}, "spec": {
            "containers": [{"name": "api", "image": "nginx", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]}}))
    _wait("both tenants' pods Running in their super clusters", lambda: all(
        _phase(core.read_namespaced_pod("api", "team-red")) == "Running" for core in (core_t, core_t2)))

    say(f"ready in {time.monotonic() - started:.0f} s")
    print()
    print(status(named_clusters(state.kubeconfigs, state.cluster_ids)))
    ui = state.temporal_ui
    print(f"Web UI, peerings of a: {ui}/namespaces/{temporal_namespace('a')}/workflows?query=WorkflowType%3D%27PeeringWorkflow%27")
    print(f"Web UI, the pool scheduler: {ui}/namespaces/{temporal_namespace('tenant')}/workflows?query=WorkflowType%3D%27PoolSchedulerWorkflow%27")
    print(f"Web UI, advertisements of b: {ui}/namespaces/{temporal_namespace('b')}/workflows?query=WorkflowType%3D%27AdvertisementWorkflow%27")
    # Local processes on the demo's well-known ports; the stand-in's virtual kubelets on free ones, each said
    # in its log at start (a restarted one says anew); b's pods on their pod IPs, which this machine routes to.
    metrics = {}
    if persistent:
        metrics = {name: f"http://127.0.0.1:{9464 + PEER_CLUSTERS.index(name)}/metrics" for name in peers}
        metrics["pool"] = f"http://127.0.0.1:{9464 + len(peers)}/metrics"
    if not real_nodes:
        for provider in providers:
            metrics[f"b's virtual kubelet for {provider}"] = _metrics_url(state, virtual_kubelet_name(f"cluster-{provider}"))
    else:
        metrics[CONSUMER] = _pod_metrics_url(apis[CONSUMER], "app.kubernetes.io/name=tidepool-worker",
                                             port=MetricsSettings().port)  # deploy/base's  # fmt: skip
        for provider in providers:
            metrics[f"b's virtual kubelet for {provider}"] = _pod_metrics_url(
                apis[CONSUMER], f"{LABEL_PROVIDER}=cluster-{provider}", port=VirtualKubeletSettings().metrics_port)  # fmt: skip
    print("Metrics: " + ", ".join(f"{url} ({name})" for name, url in metrics.items()))
    if persistent:
        print("Everything keeps running. `make demo-down` stops it.")
    return state


def _start_real_nodes(state: EnvState) -> dict[str, RealNode]:
    """b's system node, tainted for tidepool's pods alone, and d's only node; by cluster. Images built (or
    found) first: minutes once, then cached."""
    pause = pause_image()
    system = start_real_node(state.cluster(CONSUMER), name=SYSTEM_NODE, images=[tidepool_image()], pause_image=pause,
                             taints=[SYSTEM_TAINT])  # fmt: skip
    provider = start_real_node(state.cluster(REAL_PROVIDER), name=REAL_PROVIDER_NODE, images=[workload_image()],
                               pause_image=pause)  # fmt: skip
    return {CONSUMER: system, REAL_PROVIDER: provider}


def _install_as_pods(state: EnvState, cluster: str, *, host: str, pod_cidr: str, extra: dict[str, str]) -> None:
    """tidepool in `cluster` as docs/deployment.md has users install it: deploy/base through an overlay of
    their settings and their image, `kubectl apply -k`; its pods (the worker's, and the virtual kubelets' it
    makes) on the system node. Its Temporal is this machine's, at the address its pods reach."""
    settings = {name: value for name, value in extra.items() if name.startswith("TIDEPOOL_")}
    settings.update({
        "TIDEPOOL_CLUSTER_CLUSTER_ID": f"cluster-{cluster}",
        "TIDEPOOL_CLUSTER_POD_CIDR": pod_cidr,
        "TIDEPOOL_TEMPORAL_ADDRESS": f"{host}:{state.temporal_address.rsplit(':', 1)[1]}",
        "TIDEPOOL_TEMPORAL_NAMESPACE": temporal_namespace(cluster),
    })  # fmt: skip
    overlay = write_overlay(Path(state.state_dir) / "overlays" / cluster, image=tidepool_image(), settings=settings,
                            node_selector={"kubernetes.io/hostname": SYSTEM_NODE},
                            tolerations=[{**SYSTEM_TAINT, "operator": "Equal"}])  # fmt: skip
    apply_overlay(overlay, kubeconfig=Path(state.kubeconfigs[cluster]), binaries=ensure_binaries())


def _worker_pod_leads(api: k8s.ApiClient) -> bool:
    """b's worker Lease held by its pod: connected to Temporal and to its API server, its watchers running."""
    lease = k8s.CoordinationV1Api(api).read_namespaced_lease(worker_lease_name(f"cluster-{CONSUMER}"), SYSTEM_NAMESPACE)
    return lease.spec is not None and (lease.spec.holder_identity or "").startswith("tidepool-worker-")


def _hello_from_the_real_provider(state: EnvState, core_b: k8s.CoreV1Api, *, image: str) -> None:
    """A pod of b on d's virtual node, whose copy is a process on d's real node; `kubectl exec` on b reaches it
    through b's virtual kubelet (a pod on b's system node), d's API server and d's kubelet. First of the
    workload: the sample Deployment may fill d's offer."""
    say(f"running shop/{HELLO} on d's virtual node: an HTTP server, a process on d's real node {REAL_PROVIDER_NODE}")
    core_b.create_namespaced_pod("shop", k8s.V1Pod.model_validate({"metadata": {"name": HELLO}, "spec": {
        "nodeSelector": {LABEL_PROVIDER: f"cluster-{REAL_PROVIDER}"},
        "terminationGracePeriodSeconds": 5,
        "containers": [{"name": HELLO, "image": image, "imagePullPolicy": "IfNotPresent",
                        "ports": [{"containerPort": 8080}],
                        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 2},
                        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}))  # fmt: skip
    _wait(f"shop/{HELLO} Ready", lambda: _all_ready([core_b.read_namespaced_pod(HELLO, "shop")]))
    _show(state, CONSUMER, "-n", "shop", "get", "pod", HELLO, "-o", "wide")
    _show(state, REAL_PROVIDER, "get", "pods", "-A", "-o", "wide", f"--field-selector=spec.nodeName={REAL_PROVIDER_NODE}")
    _show(state, CONSUMER, "-n", "shop", "exec", HELLO, "--", "cat", "/srv/www/index.html")
    _show(state, CONSUMER, "-n", "shop", "exec", HELLO, "--", "cat", "/proc/1/cmdline")


def _show(state: EnvState, cluster: str, *args: str) -> None:
    """`kubectl <args>` on `cluster` and what it printed (NULs as spaces: a command line), as a user runs it;
    through transient failures (a virtual kubelet's API a moment after its node is Ready)."""
    kubectl = str(ensure_binaries().kubectl)
    shown = _wait(f"kubectl {' '.join(args)} on {cluster}", lambda: subprocess.run(
        [kubectl, "--kubeconfig", state.kubeconfigs[cluster], *args], check=True, capture_output=True, text=True,
        timeout=30).stdout, timeout=60)  # fmt: skip
    say(f"(on {cluster}) $ kubectl {' '.join(args)}")
    print(shown.replace("\0", " ").rstrip(), flush=True)


def _pod_metrics_url(api: k8s.ApiClient, selector: str, *, port: int) -> str:
    """The metrics endpoint of tidepool's pod that `selector` picks (not one that is going)."""
    pods = k8s.CoreV1Api(api).list_namespaced_pod(SYSTEM_NAMESPACE, label_selector=selector).items
    ips = [p.status.pod_ip for p in pods if p.status and p.status.pod_ip and not (p.metadata and p.metadata.deletion_timestamp)]
    return f"http://{ips[0]}:{port}/metrics" if ips else f"(no pod of {selector} has an IP yet)"


def processes(state: EnvState) -> dict[str, int]:
    """The process group leaders the demo started, by name (worker-a, kubelet-b, syncer-c, pool-scheduler, ...)."""
    path = _processes_file(state)
    return {name: int(pid) for name, pid in json.loads(path.read_text()).items()} if path.exists() else {}


def tear_down(state_dir: Path) -> None:
    state = EnvState.load(state_dir)
    if state is not None and _processes_file(state).exists():
        for pid in json.loads(_processes_file(state).read_text()).values():
            stop_process_group(pid)
    down(state_dir)
    say("demo stopped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.localenv.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("command", choices=["up", "down"])
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    parser.add_argument("--no-real-nodes", action="store_true",
                        help="no real node (they need root): b's worker and virtual kubelets as local processes, no d")
    args = parser.parse_args(argv)
    if args.command == "down":
        tear_down(args.state_dir)
    elif EnvState.load(args.state_dir):
        say("the demo is already running; tearing it down (run `make demo` again to start afresh)")
        tear_down(args.state_dir)
    elif not args.no_real_nodes and os.geteuid() != 0:
        say("the demo's real nodes need root (containerd, iptables): run it as root, or with --no-real-nodes")
        return 1
    else:
        bring_up(args.state_dir, real_nodes=not args.no_real_nodes)
    return 0



def _distinct_endpoints(api: k8s.ApiClient, namespace: str, service: str, *, count: int) -> dict[str, str] | None:
    """The ready addresses of the Service's EndpointSlices, each with the node of its pod, once there are
    `count` of them and no two share an address (a collision would leave one pod unreachable); else None."""
    slices = k8s.DiscoveryV1Api(api).list_namespaced_endpoint_slice(
        namespace, label_selector=f"kubernetes.io/service-name={service}").items  # fmt: skip
    ready = [(address, e.node_name or "?") for s in slices for e in s.endpoints or []
             if e.conditions and e.conditions.ready for address in e.addresses]  # fmt: skip
    distinct = dict(ready)
    return distinct if len(ready) == count and len(distinct) == count else None


def _endpoints_table(api: k8s.ApiClient, endpoints: dict[str, str], *, pod_cidrs: dict[str, str]) -> str:
    """One line per address: where its pod runs, and for an offloaded one, how b shows its provider's IPs."""
    own = NODES[CONSUMER]
    where = {node: f"on b's own {node} ({block})"
             for (node, _, _), block in zip(own, node_pod_cidrs(pod_cidrs[CONSUMER], len(own)), strict=True)}  # fmt: skip
    for provider in (p for p in pod_cidrs if p != CONSUMER):
        status = (read_cluster_object(api, ADVERTISEMENTS, advertisement_name(f"cluster-{provider}")) or {}).get("status") or {}
        remapped = status.get("remoteRemappedPodCIDR") or "?"
        shown = "shown as they are" if remapped == NO_REMAPPING else f"remapped into {remapped}"
        where[virtual_node_name(f"cluster-{provider}")] = (
            f"offloaded to {provider} (PodCIDR {pod_cidrs[provider]}, {shown})")
    return "\n".join(f"    {address:<15} {where.get(node, node)}"
                     for address, node in sorted(endpoints.items(), key=lambda item: ipaddress.ip_address(item[0])))


def _metrics_url(state: EnvState, process: str) -> str:
    """Where `process` serves its metrics, as its log's start line says (workers/metrics.py)."""
    log = Path(state.state_dir) / "logs" / f"{process}.log"
    found = _wait(f"{process}'s metrics address in {log}", lambda: METRICS_LINE.findall(log.read_text()), timeout=30)
    return str(found[-1][1]).replace("0.0.0.0", "127.0.0.1")  # noqa: S104 - the address it bound, read back


def _all_ready(objects: list[k8s.V1Pod] | list[k8s.V1Node]) -> bool:
    """Some pods or nodes, every one with its Ready condition True."""
    return bool(objects) and all(any(c.type == "Ready" and c.status == "True" for c in
                                     (o.status.conditions if o.status else None) or []) for o in objects)  # fmt: skip


def _phase(pod: k8s.V1Pod) -> str | None:
    return pod.status.phase if pod.status else None


if __name__ == "__main__":
    sys.exit(main())
