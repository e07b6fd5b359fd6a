"""resource_compute: the shared-resource computation of a real API server holding many kwok nodes and
pods (5,000 and 100,000 at scale 1; `--scale 0.1` for a tenth).

The cluster is filled fast, with concurrent POSTs whose responses are not deserialised: nodes annotated
for kwok, pods with nodeName set (no scheduler work; kwok still marks each Running, so the API server also
takes 100,000 status writes). Then, in this order, so that the memory figure is the aggregate's alone:

- cold: the product's capacity aggregate (kube/capacity.HomeCapacity over kube/informer.py)
  starts and lists, until the first computation (snapshot + shared_resources) returns;
- memory: this process's resident memory with the aggregate synced (the worker's share of it);
- steady: `changes` pods are deleted and as many created; once the watch has brought them in, the time
  of one computation (the median of 20), what every push of every peering pays;
- baselines: the straightforward kubernetes-client list of every node and pod with model
  deserialisation, then the same computation over them (naive); and a bare `json.loads` of the pod
  list's bytes, fetched once beforehand (parse).
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

import urllib3
from kubernetes import client as k8s

from bench.common import emit, local_env, log, rss_mb
from deploy.localenv.clusters import fake_node
from kube.capacity import HomeCapacity
from models.sharing import CapacityAggregate, shared_resources
from tests.kube import pod_spec

DEFAULTS: dict[str, Any] = {"scale": 1.0, "changes": 100, "threads": 16}
NODES, PODS, NAMESPACES = 5000, 100_000, 100
CHUNK = 1000
# The consumer whose offer is computed: it has offloaded nothing here, so its offer subtracts every pod.
CONSUMER = "bench-consumer"


def _create(api: k8s.ApiClient, *, nodes: int, pods: int, threads: int) -> None:
    core = k8s.CoreV1Api(api)
    namespaces = [f"load-{i}" for i in range(max(1, min(NAMESPACES, pods // 100)))]
    for ns in namespaces:
        core.create_namespace(k8s.V1Namespace.model_validate({"metadata": {"name": ns}}))
    started = time.monotonic()

    def node(i: int) -> None:
        core.create_node(k8s.V1Node.model_validate(fake_node(f"node-{i}", cpu="32", memory="64Gi", pods="110")), _preload_content=False)

    def pod(i: int) -> None:
        body = {"metadata": {"name": f"pod-{i}"},
                "spec": pod_spec(requests={"cpu": "100m", "memory": "128Mi"}, node_name=f"node-{i % nodes}")}  # fmt: skip
        core.create_namespaced_pod(namespaces[i % len(namespaces)], k8s.V1Pod.model_validate(body), _preload_content=False)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(node, range(nodes)))
        log(f"{nodes} nodes in {time.monotonic() - started:.0f} s")
        # In chunks, so that an interrupted run does not first drain 100,000 queued requests.
        for chunk in range(0, pods, CHUNK):
            list(pool.map(pod, range(chunk, min(pods, chunk + CHUNK))))
            if (chunk + CHUNK) % 10_000 == 0:
                log(f"{chunk + CHUNK} pods in {time.monotonic() - started:.0f} s")


def _compute(capacity: HomeCapacity) -> Any:
    allocatable, used = capacity.snapshot(CONSUMER)
    return shared_resources(allocatable=allocatable, used=used, percent=50)


def _measure(params: dict[str, Any]) -> None:
    scale = float(params["scale"])
    nodes, pods, changes = max(1, int(NODES * scale)), max(1, int(PODS * scale)), int(params["changes"])
    with local_env(["big"]) as env:
        api = env.cluster("big").api_client()
        _create(api, nodes=nodes, pods=pods, threads=int(params["threads"]))
        core = k8s.CoreV1Api(api)
        gc.collect()
        rss_before = rss_mb()

        started = time.perf_counter()
        capacity = HomeCapacity(api).start()
        expected = _compute(capacity)
        cold = time.perf_counter() - started
        gc.collect()
        rss_synced = rss_mb()
        log(f"cold {cold:.2f} s; shared {expected.to_kubernetes()}")

        # Steady: some pods go, as many come; wait until the watch has brought every change in.
        used_before = capacity.snapshot(CONSUMER)[1]
        for i in range(changes):
            core.delete_namespaced_pod(f"pod-{i}", f"load-{i % max(1, min(NAMESPACES, pods // 100))}",
                                       grace_period_seconds=0, _preload_content=False)  # fmt: skip
        for i in range(changes):
            body = {"metadata": {"name": f"new-{i}"},
                    "spec": pod_spec(requests={"cpu": "200m", "memory": "128Mi"}, node_name=f"node-{i % nodes}")}  # fmt: skip
            core.create_namespaced_pod("load-0", k8s.V1Pod.model_validate(body), _preload_content=False)
        want_cpu = used_before["cpu"] + Decimal("0.1") * changes  # each replaced pod asks 100m more
        deadline = time.monotonic() + 120
        while capacity.snapshot(CONSUMER)[1]["cpu"] != want_cpu:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the aggregate did not reach {want_cpu} CPU used within 120 s")
            time.sleep(0.05)
        steady_samples = []
        for _ in range(20):
            t = time.perf_counter()
            _compute(capacity)
            steady_samples.append(time.perf_counter() - t)
        steady = statistics.median(steady_samples)
        capacity.stop()
        del capacity
        gc.collect()

        # Without preloading the client returns urllib3's response, not the V1PodList it is typed to return.
        response: object = core.list_pod_for_all_namespaces(_preload_content=False)
        if not isinstance(response, urllib3.BaseHTTPResponse):
            raise TypeError(f"expected an HTTP response, got {type(response).__name__}")
        raw = response.data
        t = time.perf_counter()
        parsed = json.loads(raw)
        parse = time.perf_counter() - t
        listed_bytes, listed_pods = len(raw), len(parsed["items"])
        del raw, parsed
        gc.collect()

        t = time.perf_counter()
        node_list, pod_list = core.list_node(), core.list_pod_for_all_namespaces()
        deserialised = time.perf_counter() - t
        aggregate = CapacityAggregate.from_lists(
            (api.sanitize_for_serialization(n) for n in node_list.items),
            (api.sanitize_for_serialization(p) for p in pod_list.items),
        )
        naive = time.perf_counter() - t
        log(f"naive {naive:.2f} s (list+deserialise {deserialised:.2f} s); bare parse {parse:.2f} s")
        del node_list, pod_list, aggregate

    common = {"scale": scale, "nodes": nodes, "pods": pods, "pods_listed": listed_pods,
              "pod_list_mb": round(listed_bytes / 2**20, 1)}  # fmt: skip
    emit(
        "resource_compute.cold",
        cold,
        "s",
        baseline=parse,
        params={**common, "baseline": "bare json.loads of the pod list bytes", "target": "≤ 1.5× baseline"},
    )
    emit("resource_compute.steady", steady * 1000, "ms", baseline=naive * 1000,
         params={**common, "changes": changes, "baseline": "kubernetes-client list of nodes and pods with model "
                 "deserialisation, then the same computation", "naive_list_deserialise_s": round(deserialised, 2),
                 "target": "≤ 50 ms and ratio ≤ 0.01"})  # fmt: skip
    emit("resource_compute.memory", rss_synced, "MiB", baseline=rss_before,
         params={**common, "what": "resident memory of the process holding the synced aggregate; baseline: "
                 "the same process before the aggregate started", "target": "≤ 500 MiB"})  # fmt: skip


def run(params: dict[str, Any]) -> None:
    _measure(params)
