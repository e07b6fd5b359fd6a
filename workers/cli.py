"""The `tidepool` command: what the `temporal` CLI cannot show in one view.

  tidepool status [--cluster NAME=KUBECONFIG ...]   peerings, advertisements, virtual nodes, offloaded pods,
                                                    the pool's tenants, its placements and pods
  tidepool peer --provider KUBECONFIG --provider-id ID --consumer KUBECONFIG --consumer-id ID
                [--token-lifetime SECONDS] [--consumer-server URL]
  tidepool unpeer --provider KUBECONFIG --consumer-id ID [--force]    on the provider
  tidepool unpeer --consumer KUBECONFIG --provider-id ID [--force]    on the consumer
  tidepool offload namespace NS [--selector 'k=v,k2 in (a,b),!k3'] [--pod-strategy LocalAndRemote|Remote|Local]
                 [--namespace-mapping DefaultName|EnforceSameName|SelectedName[=NAME]] [--remote-namespace NAME]
                 [--wait] [--kubeconfig FILE]   on a consumer: lets NS's pods run in the selected providers
  tidepool unoffload namespace NS [--wait] [--kubeconfig FILE]   drains NS's pods home, then unoffloads it
  tidepool explain peering FOREIGN | advertisement PROVIDER | namespace NS | pod NS/NAME [--tenant T]
                 [--kubeconfig FILE] [--cluster-id ID] [--at TIME] [-o json]
                                                    the decisions behind it, from the workflows' histories
  tidepool simulate peering FOREIGN --sharing-percentage N [--since 24h|TIME] [--cluster-id ID] [-o json]
                                                    the recorded pushes, recomputed at another percentage
  tidepool simulate admission --max N [--since 24h|TIME] [--cluster-id ID] [-o json]
                                                    the recorded admission passes at another maximum
  tidepool simulate pool --policy spread|pack [--since 24h|TIME] [--workflow-id ID] [-o json]
                                                    the recorded pool passes under another policy
  tidepool pool add-tenant NAME --tenant-kubeconfig FILE [--weight N] [--server URL] [--kubeconfig FILE]
                                                    registers a tenant control plane with the pool (again: renews)
  tidepool pool remove-tenant NAME [--wait] [--timeout 10m] [--tenant-kubeconfig FILE] [--kubeconfig FILE]
                                                    deletes a Tenant; the super clusters drain it

Without --cluster, `status` reads the clusters of the running local environment from its state file
(`make demo` writes it; any JSON file with a `kubeconfigs` map of cluster name to kubeconfig path will do;
its `cluster_ids` map names each cluster by the cluster id its worker runs as). The pool's Tenants are read
from a given cluster that has them (its management cluster); a tenant's placements and pods from the given
cluster of its name, else through its kubeconfig Secret there, read with your credentials.

`peer` runs with an administrator's kubeconfig of each cluster: on the consumer it mints an identity for
this provider alone (its Advertisement, its credentials Secret, its own next token) and hands the provider
a short-lived token of it, never the administrator's credentials. Run it again to renew a token that
expired while the provider was down.

`offload` and `unoffload` run with a kubeconfig of the consumer (--kubeconfig, else $KUBECONFIG, else
~/.kube/config) that may write NamespaceOffloadings in NS.

`pool add-tenant` and `pool remove-tenant` run with a kubeconfig of the pool's management cluster (--kubeconfig,
else $KUBECONFIG, else ~/.kube/config) and, to mint or revoke the pool's identity there, an administrator's
kubeconfig of the tenant's control plane (--tenant-kubeconfig). A removed Tenant is gone once every super
cluster's syncer has deleted what it made for it; its kubeconfig Secret and identity go after it.

`explain` reads only the cluster's Temporal namespace: the flags, else TIDEPOOL_TEMPORAL_* as the worker, else
the local environment's (its state file has each worker's namespace by cluster id, and the pool's):
`peering` on a provider, `advertisement` and `simulate admission` on a consumer (--cluster-id, default TIDEPOOL_CLUSTER_CLUSTER_ID);
`namespace` and `pod` of the pool, in the pool worker's namespace (--workflow-id if it is not pool-scheduler),
of tenant T (--tenant; needed only when the records have NS for several tenants);
`pod --kubeconfig` a consumer's pod on a virtual node, whose node and Events it reads from that cluster."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from urllib3.exceptions import HTTPError

from kube.clients import client_from_own_kubeconfig_file
from kube.clock import utcnow
from kube.identity import DEFAULT_TOKEN_LIFETIME_SECONDS
from kube.objects import list_cluster_objects
from models.api.clusterconfig import MAX_ACCEPTABLE_ADVERTISEMENTS
from models.api.common import DNS_LABEL
from models.api.offloading import NamespaceOffloadingSpec
from models.api.tenant import MAX_WEIGHT, NAME_RULE
from models.enforcement import status_message
from models.explain import Story
from models.names import (
    ADVERTISEMENTS,
    LABEL_CONSUMER,
    LABEL_NODE_TYPE,
    PEERING_REQUESTS,
    PLACEMENTS_ANNOTATION,
    POD_CLUSTER_ANNOTATION,
    POOL_SCHEDULER_WORKFLOW_ID,
    TENANTS,
    VIRTUAL_NODE_TYPE,
    namespace_reserved,
)
from models.offloading import parse_selector
from models.pool.namespaces import POLICIES
from models.remote_namespaces import owned_by
from models.settings import TemporalSettings, WorkerSettings
from models.sharing import offloaded_by
from models.simulate import AdmissionSimulation, PoolSimulation, Simulation
from models.virtual_kubelet import ORIGIN_NAME, ORIGIN_NAMESPACE
from workers.cluster import connect
from workers.explain import (
    NoHistory,
    explain_advertisement,
    explain_consumer_pod,
    explain_namespace,
    explain_peering,
    explain_pod,
    simulate_admission_history,
    simulate_peering_history,
    simulate_pool_history,
)
from workers.offload_command import (
    OffloadError,
    offload_namespace,
    offloaded_namespace_rows,
    unoffload_namespace,
    virtual_node_pod_rows,
)
from workers.peer import cancel_peering, leave_provider, request_peering
from workers.pool_status import TENANT_HEADER, read_tenant, tenant_planes, tenant_rows, unreadable
from workers.tenant_command import (
    TenantCommandError,
    add_tenant_command,
    remove_tenant_command,
    tenant_arguments_problem,
)

# Where `make demo` (deploy/localenv) records the running clusters: the CLI reads the file, it does not
# import the tooling that writes it (deploy depends on workers, never the other way). The variable names
# another environment's (`python -m deploy.localenv --state-dir DIR up`, the tests').
LOCAL_ENV_STATE = Path(__file__).resolve().parents[1] / ".tidepool" / "localenv" / "state.json"
LOCAL_ENV_STATE_VARIABLE = "TIDEPOOL_LOCALENV_STATE"
# The key of the pool's scheduler in the state's `worker_namespaces` (the demo runs it as cluster id `pool`).
POOL_WORKER = "pool"


def _local_env_state_file() -> Path:
    return Path(os.environ.get(LOCAL_ENV_STATE_VARIABLE) or LOCAL_ENV_STATE)


def _local_env_state(path: Path) -> dict[str, Any]:
    """The state file as written by deploy/localenv/env.py EnvState; empty when no environment runs."""
    return json.loads(path.read_text()) if path.exists() else {}


def _table(title: str, header: list[str], rows: Sequence[Sequence[object]]) -> str:
    if not rows:
        return f"{title}: none\n"
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=False)]
    lines = [title, "  " + "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=False))]
    lines += ["  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)) for row in rows]
    return "\n".join(lines) + "\n"


def _list(api: k8s.ApiClient, plural: str) -> list[dict[str, Any]]:
    try:
        return list_cluster_objects(api, plural)
    except k8s.ApiException:
        return []


def status(clusters: dict[str, Path]) -> str:
    peerings, adverts, nodes, offloaded, placements, pool_pods = [], [], [], [], [], []
    offloaded_namespaces, virtual_node_pods = [], []
    apis = {name: client_from_own_kubeconfig_file(str(kubeconfig)) for name, kubeconfig in clusters.items()}
    tenants = [(api, tenant) for api in apis.values() for tenant in _list(api, TENANTS)]
    planes = tenant_planes(tenants, apis)
    for name, api in apis.items():
        for request in _list(api, PEERING_REQUESTS):
            st = request.get("status") or {}
            peerings.append([name, request["spec"]["clusterIdentity"]["clusterId"], st.get("phase", "—"),
                             st.get("advertisementStatus") or "—", st.get("lastPushTime", "—")])  # fmt: skip
        for adv in _list(api, ADVERTISEMENTS):
            hard = (adv["spec"].get("resourceQuota") or {}).get("hard") or {}
            st = adv.get("status") or {}
            adverts.append([name, adv["spec"].get("clusterId", "?"), st.get("phase", "Pending"), st.get("reason", ""),
                            hard.get("cpu", "—"), hard.get("memory", "—"), adv["spec"].get("timeToLive", "—")])  # fmt: skip
        core = k8s.CoreV1Api(api)
        # One list of the cluster's pods serves the virtual nodes' counts, the offloaded and the pool pods.
        pods = core.list_pod_for_all_namespaces().items
        pods_per_node = Counter(pod.spec.node_name if pod.spec else None for pod in pods)
        offloaded_namespaces += offloaded_namespace_rows(name, api)
        virtual_node_pods += virtual_node_pod_rows(name, pods)
        for node in core.list_node(label_selector=f"{LABEL_NODE_TYPE}={VIRTUAL_NODE_TYPE}").items:
            node_name, node_status = (node.metadata or k8s.V1ObjectMeta()).name, node.status or k8s.V1NodeStatus()
            ready = next((c for c in node_status.conditions or [] if c.type == "Ready"), None)
            allocatable = node_status.allocatable or {}
            nodes.append([name, node_name, f"{ready.status} ({ready.reason})" if ready else "Unknown",
                          allocatable.get("cpu", "—"), allocatable.get("memory", "—"),
                          str(pods_per_node[node_name])])  # fmt: skip
        namespaces = core.list_namespace().items
        # The namespaces this cluster made for its consumers' RemoteNamespaces: their pods are those consumers'.
        made_for = {}
        for ns in namespaces:
            labels = (ns.metadata.labels if ns.metadata else None) or {}
            if ns.metadata and ns.metadata.name and owned_by(labels, labels.get(LABEL_CONSUMER, "")):
                made_for[ns.metadata.name] = labels[LABEL_CONSUMER]
        for pod in pods:
            meta = pod.metadata or k8s.V1ObjectMeta()
            annotations = meta.annotations or {}
            where, phase = f"{meta.namespace}/{meta.name}", (pod.status.phase if pod.status else None) or "Pending"
            consumer = offloaded_by({"metadata": {"namespace": meta.namespace}}, made_for)
            if consumer is not None:  # a reflected pod: where a consumer's pod really runs (whose: where it runs)
                offloaded.append([consumer,
                                  f"{annotations.get(ORIGIN_NAMESPACE, '?')}/{annotations.get(ORIGIN_NAME, '?')}", name,
                                  where, phase])  # fmt: skip
        tenant = planes.given.get(name, name)  # a cluster that is no registered Tenant's (0.1's pool): by its name
        placements += _placement_rows(tenant, namespaces)
        pool_pods += _pool_pod_rows(tenant, pods)
    for tenant, tenant_api in sorted(planes.reached.items()):
        try:
            tenant_namespaces, tenant_pods = read_tenant(tenant_api)
        except (ApiException, HTTPError, OSError) as e:
            planes.problems[tenant] = unreadable(e)
            continue
        placements += _placement_rows(tenant, tenant_namespaces)
        pool_pods += _pool_pod_rows(tenant, tenant_pods)
    placements += [[tenant, "—", f"not read: {why}"] for tenant, why in sorted(planes.problems.items())]
    return "".join([
        _table("Peerings (provider side)", ["provider", "foreign", "phase", "foreign decision", "last push"], peerings),
        _table("Advertisements (consumer side)", ["consumer", "from", "phase", "reason", "cpu", "memory", "expires"],
               adverts),
        _table("Virtual nodes", ["cluster", "node", "ready", "cpu", "memory", "pods"], nodes),
        _table("Offloaded namespaces (consumer side)", ["cluster", "namespace", "pods", "clusters selected",
                                                        "remote namespaces", "ready"], offloaded_namespaces),
        _table("Pods on virtual nodes (consumer side)", ["cluster", "pod", "node", "phase", "why not running"],
               virtual_node_pods),
        _table("Offloaded pods", ["consumer", "pod", "runs in", "as", "phase there"], offloaded),
        _table("Tenants", TENANT_HEADER, tenant_rows(tenant for _, tenant in tenants)),
        _table("Pool placements", ["tenant", "namespace", "slices per super cluster"], placements),
        _table("Pool pods", ["tenant", "pod", "super cluster", "phase"], pool_pods),
    ])  # fmt: skip


def _placement_rows(tenant: str, namespaces: Sequence[k8s.V1Namespace]) -> list[list[str]]:
    rows = []
    for ns in namespaces:
        meta = ns.metadata or k8s.V1ObjectMeta()
        annotation = (meta.annotations or {}).get(PLACEMENTS_ANNOTATION)
        if annotation:
            rows.append([tenant, meta.name or "", ", ".join(f"{c}×{n}" for c, n in json.loads(annotation).items())])
    return rows


def _pool_pod_rows(tenant: str, pods: Sequence[k8s.V1Pod]) -> list[list[str]]:
    rows = []
    for pod in pods:
        meta = pod.metadata or k8s.V1ObjectMeta()
        cluster = (meta.annotations or {}).get(POD_CLUSTER_ANNOTATION)
        if cluster is not None:
            rows.append([tenant, f"{meta.namespace}/{meta.name}", cluster, (pod.status.phase if pod.status else None) or "Pending"])
    return rows


def _clusters(args: argparse.Namespace) -> dict[str, Path]:
    """The clusters by the names the tables give them."""
    if args.cluster:
        return {name: Path(path) for name, path in (item.split("=", 1) for item in args.cluster)}
    state = _local_env_state(args.state_file)
    if not state:
        raise SystemExit(f"no --cluster given and no local environment running ({args.state_file} absent: make demo)")
    return named_clusters(state["kubeconfigs"], state.get("cluster_ids") or {})


def named_clusters(kubeconfigs: dict[str, str], cluster_ids: dict[str, str]) -> dict[str, Path]:
    """The local environment's clusters by the cluster id its worker runs as, if it runs one: the name the
    other side's objects (PeeringRequests, Advertisements, offloaded namespaces) call it by."""
    return {cluster_ids.get(name, name): Path(path) for name, path in kubeconfigs.items()}


def _timestamp(text: str) -> datetime:
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time, e.g. 2026-11-25T14:00:00Z") from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _history_arguments_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the names `explain` and `simulate` are given, naming the argument and the rule (they
    end up in a visibility query and in workflow ids)."""
    consumer_pod = args.kind == "pod" and getattr(args, "kubeconfig", None)
    tenant = getattr(args, "tenant", None)
    if tenant is not None and (args.kind not in ("namespace", "pod") or consumer_pod):
        return "--tenant names a pool's tenant: it is for `explain namespace` and `explain pod` of the pool"
    if tenant is not None and not _dns_label(tenant):
        return f"--tenant {tenant!r} is not a Tenant's name: its {NAME_RULE}"
    if args.kind in ("peering", "advertisement", "admission") or consumer_pod:
        subject = {"peering": "FOREIGN", "advertisement": "PROVIDER"}.get(args.kind)
        names = [("--cluster-id", args.cluster_id)] + ([(subject, args.subject)] if subject else [])
        for what, value in names:
            if not value:
                return f"{what} is required" + (" (or set TIDEPOOL_CLUSTER_CLUSTER_ID)" if what == "--cluster-id" else "")
            if not _dns_label(value):
                return f"{what} {value!r} is not a cluster id (a DNS-1123 label: lowercase letters, digits and '-')"
        if not consumer_pod:
            return None
    if args.kind == "pool":
        return _workflow_id_problem(args.workflow_id)
    namespace, _, pod = args.subject.partition("/")
    if not _dns_label(namespace) or (args.kind == "pod" and not re.fullmatch(_DNS_SUBDOMAIN, pod)):
        form = "NAMESPACE/POD" if args.kind == "pod" else "NAMESPACE"
        return f"NAME must be {form} (Kubernetes names: lowercase letters, digits, '-'), got {args.subject!r}"
    return _workflow_id_problem(args.workflow_id)


def _workflow_id_problem(workflow_id: str) -> str | None:
    if not re.fullmatch(r"[^'\"\\]+", workflow_id):
        return f"--workflow-id {workflow_id!r} must not contain quotes or backslashes"
    return None


def _dns_label(name: str) -> bool:
    """A cluster id or a namespace: the rule the API models hold them to (models.api.common.DNS_LABEL)."""
    return len(name) <= 63 and re.fullmatch(DNS_LABEL, name) is not None


_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"


def _selector(text: str) -> NamespaceOffloadingSpec:
    """--selector as the NamespaceOffloading's clusterSelector (carried in a spec: argparse keeps the value)."""
    try:
        return NamespaceOffloadingSpec(cluster_selector=parse_selector(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).splitlines()[0]) from None


def _offloading_spec(args: argparse.Namespace) -> tuple[NamespaceOffloadingSpec | None, str | None]:
    """The spec `offload namespace` asks for, or what is wrong with its arguments (the argument and the rule)."""
    if not _dns_label(args.namespace):
        return None, f"NS {args.namespace!r} is not a namespace name (a DNS-1123 label: lowercase letters, digits, '-')"
    mapping, _, named = args.namespace_mapping.partition("=")
    remote = args.remote_namespace or named or None
    if mapping not in MAPPINGS:
        return None, f"--namespace-mapping {args.namespace_mapping!r} is not one of {', '.join(MAPPINGS)}"
    if (mapping == "SelectedName") != (remote is not None) or (named and args.remote_namespace):
        return None, ("--remote-namespace NAME (or --namespace-mapping SelectedName=NAME) is required with "
                      "SelectedName, and only with it, once")
    asked = {"EnforceSameName": args.namespace, "SelectedName": remote}.get(mapping)
    if asked is not None and not _dns_label(asked):
        return None, f"remote namespace {asked!r} is not a namespace name (a DNS-1123 label)"
    if asked is not None and namespace_reserved(asked):
        return None, (f"remote namespace {asked!r} is reserved in every provider (default, kube-*, tidepool-*, "
                      "openshift-*): use --namespace-mapping DefaultName or another name")
    selector = (args.selector or NamespaceOffloadingSpec()).cluster_selector
    return NamespaceOffloadingSpec(pod_offloading_strategy=args.pod_strategy, namespace_mapping_strategy=mapping,
                                   remote_namespace_name=remote, cluster_selector=selector), None  # fmt: skip


MAPPINGS = ("DefaultName", "EnforceSameName", "SelectedName")
STRATEGIES = ("LocalAndRemote", "Remote", "Local")


def _default_kubeconfig() -> str:
    return os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")


def _percentage(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 100:
        raise argparse.ArgumentTypeError(f"{text!r}: a sharing percentage is a whole number from 0 to 100")
    return int(text)


def _maximum(text: str) -> int:
    if not text.isdigit() or int(text) > MAX_ACCEPTABLE_ADVERTISEMENTS:
        raise argparse.ArgumentTypeError(f"{text!r}: maxAcceptableAdvertisements is a whole number from 0 to "
                                         f"{MAX_ACCEPTABLE_ADVERTISEMENTS}")  # fmt: skip
    return int(text)


def _since(text: str) -> datetime:
    units = {"m": 60, "h": 3600, "d": 86400}
    if text[:-1].isdigit() and text[-1:] in units:
        try:
            return utcnow() - timedelta(seconds=int(text[:-1]) * units[text[-1]])
        except OverflowError:
            raise argparse.ArgumentTypeError(f"{text!r} reaches back before year 1") from None
    try:
        return _timestamp(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a duration (30m, 24h, 7d) nor an ISO 8601 time") from None


def _kubeconfig(path: str, flag: str = "--kubeconfig") -> k8s.ApiClient:
    try:
        return client_from_own_kubeconfig_file(path)
    except ConfigException as e:
        raise LookupError(f"{flag} {path}: {e}") from None


def _duration(text: str) -> float:
    """Seconds, or a number of s, m or h (--timeout 10m)."""
    units = {"s": 1, "m": 60, "h": 3600}
    number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "s")
    try:
        seconds = float(number) * units[unit]
    except ValueError:
        seconds = -1
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (600, 600s, 10m, 1h)")
    return seconds


def _temporal_settings(args: argparse.Namespace, temporal: TemporalSettings) -> tuple[TemporalSettings, str]:
    """Where the histories are, and where the namespace was taken from: the flags, else the worker's variables
    (TIDEPOOL_TEMPORAL_*), else the local environment's state (the namespace of the worker that runs as
    --cluster-id, or of the pool's scheduler), else the settings' defaults."""
    state = _local_env_state(args.state_file)
    pool = args.kind in ("namespace", "pool") or (args.kind == "pod" and not getattr(args, "kubeconfig", None))
    worker = POOL_WORKER if pool else args.cluster_id
    found: dict[str, str] = {}
    if "address" not in temporal.model_fields_set and state.get("temporal_address"):
        found["address"] = state["temporal_address"]
    source = "TIDEPOOL_TEMPORAL_NAMESPACE" if "namespace" in temporal.model_fields_set else "the default"
    if source == "the default" and worker in (state.get("worker_namespaces") or {}):
        found["namespace"] = state["worker_namespaces"][worker]
        source = f"the local environment's state ({args.state_file}), for {'the pool' if pool else worker}"
    if args.namespace:
        source = "--namespace"
    flags = {k: v for k, v in (("address", args.temporal_address), ("namespace", args.namespace)) if v}
    return temporal.model_copy(update=found | flags), source


async def _client(args: argparse.Namespace, temporal: TemporalSettings) -> Client:
    return await connect(_temporal_settings(args, temporal)[0])


async def _answer(args: argparse.Namespace, temporal: TemporalSettings) -> Story | Simulation | AdmissionSimulation | PoolSimulation:
    consumer = _kubeconfig(args.kubeconfig) if getattr(args, "kubeconfig", None) else None  # before Temporal: its error first
    client = await _client(args, temporal)
    if args.command == "simulate" and args.kind == "pool":
        return await simulate_pool_history(client, policy=args.policy, since=args.since, workflow_id=args.workflow_id)
    if args.command == "simulate" and args.kind == "admission":
        return await simulate_admission_history(client, home=args.cluster_id, maximum=args.maximum, since=args.since)
    if args.command == "simulate":
        return await simulate_peering_history(client, home=args.cluster_id, foreign=args.subject,
                                              percent=args.sharing_percentage, since=args.since)  # fmt: skip
    if args.kind == "peering":
        return await explain_peering(client, home=args.cluster_id, foreign=args.subject, at=args.at)
    if args.kind == "advertisement":
        return await explain_advertisement(client, home=args.cluster_id, provider=args.subject, at=args.at)
    if args.kind == "namespace":
        return await explain_namespace(client, namespace=args.subject, tenant=args.tenant, at=args.at,
                                       workflow_id=args.workflow_id)  # fmt: skip
    namespace, pod = args.subject.split("/", 1)
    if consumer is not None:
        return await explain_consumer_pod(client, consumer, home=args.cluster_id, namespace=namespace, pod=pod, at=args.at)
    return await explain_pod(client, namespace=namespace, pod=pod, tenant=args.tenant, at=args.at,
                             workflow_id=args.workflow_id, control_plane=partial(_tenant_control_plane, args.state_file))  # fmt: skip


def _tenant_control_plane(state_file: Path, tenant: str) -> k8s.ApiClient | None:
    """A tenant's control plane, found as `status` finds it: the local environment's cluster of its name, else
    through its Tenant's kubeconfig Secret in a cluster that has Tenants, read with your credentials; None
    when neither (the story is then the history's alone)."""
    state = _local_env_state(state_file)
    if not state:
        return None
    apis = {name: client_from_own_kubeconfig_file(str(path))
            for name, path in named_clusters(state["kubeconfigs"], state.get("cluster_ids") or {}).items()}  # fmt: skip
    if tenant in apis:
        return apis[tenant]
    tenants = [(api, obj) for api in apis.values() for obj in _list(api, TENANTS)
               if (obj.get("metadata") or {}).get("name") == tenant]  # fmt: skip
    planes = tenant_planes(tenants, apis)
    by_tenant = {name: cluster for cluster, name in planes.given.items()}
    return apis[by_tenant[tenant]] if tenant in by_tenant else planes.reached.get(tenant)


def _offload(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    spec: NamespaceOffloadingSpec | None = None
    if args.command == "offload":
        spec, problem = _offloading_spec(args)
    else:
        problem = None if _dns_label(args.namespace) else f"NS {args.namespace!r} is not a namespace name"
    if problem:
        parser.error(f"{args.command} namespace: {problem}")
    try:
        api = _kubeconfig(args.kubeconfig or _default_kubeconfig())
        if spec is not None:
            offload_namespace(api, args.namespace, spec, wait=args.wait, timeout=args.timeout, say=print)
        else:
            unoffload_namespace(api, args.namespace, wait=args.wait, timeout=args.timeout, say=print)
    except (LookupError, OffloadError, OSError) as e:
        print(f"tidepool {args.command}: {e}", file=sys.stderr)
        return 1
    return 0


def _say(line: str) -> None:
    print(line, flush=True)  # a waiting command's progress reaches a pipe as it happens


def _pool(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    problem = tenant_arguments_problem(args.name, getattr(args, "weight", None))
    if problem:
        parser.error(f"pool {args.action}: {problem}")
    try:
        management = _kubeconfig(args.kubeconfig or _default_kubeconfig())
        tenant_admin = _kubeconfig(args.tenant_kubeconfig, "--tenant-kubeconfig") if args.tenant_kubeconfig else None
        if args.action == "add-tenant" and tenant_admin is not None:  # the parser requires it
            add_tenant_command(management, tenant_admin, args.name, weight=args.weight, server=args.server, say=_say)
        else:
            remove_tenant_command(management, args.name, wait=args.wait, timeout=args.timeout, tenant_admin=tenant_admin,
                                  say=_say)  # fmt: skip
    except (LookupError, TenantCommandError, ApplicationError, ApiException, HTTPError, OSError) as e:
        reason = (status_message(e.body) or e.reason) if isinstance(e, ApiException) else e
        print(f"tidepool pool {args.action}: {reason}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tidepool", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("status", help="one table across clusters")
    show.add_argument("--cluster", action="append", metavar="NAME=KUBECONFIG")
    show.add_argument("--state-file", type=Path, default=_local_env_state_file(),
                      help=f"the local environment's state (its kubeconfigs map); used without --cluster "
                           f"(default: ${LOCAL_ENV_STATE_VARIABLE}, else .tidepool/localenv/state.json)")  # fmt: skip
    peer = sub.add_parser("peer", help="ask a provider for resources (writes a PeeringRequest on it)")
    peer.add_argument("--provider", required=True, help="kubeconfig of the provider cluster")
    peer.add_argument("--provider-id", required=True, help="the provider's cluster id (its identity's names)")
    peer.add_argument("--consumer", required=True,
                      help="an administrator's kubeconfig of the consumer: mints the provider's identity there")
    peer.add_argument("--consumer-id", required=True)
    peer.add_argument("--token-lifetime", type=int, default=DEFAULT_TOKEN_LIFETIME_SECONDS, metavar="SECONDS",
                      help="life of the provider's token on the consumer (at least 600), renewed by the provider "
                           "at half of it")  # fmt: skip
    peer.add_argument("--consumer-server", metavar="URL",
                      help="the consumer's API server as the provider reaches it (default: the one in --consumer)")
    unpeer = sub.add_parser("unpeer", help="end a peering, from either side: the provider withdraws (deletes the "
                            "PeeringRequest), or the consumer leaves (revokes the provider, deletes its Advertisement)")
    unpeer.add_argument("--provider", metavar="KUBECONFIG", help="on the provider: with --consumer-id")
    unpeer.add_argument("--consumer-id")
    unpeer.add_argument("--consumer", metavar="KUBECONFIG", help="on the consumer: with --provider-id")
    unpeer.add_argument("--provider-id")
    unpeer.add_argument("--force", action="store_true",
                        help="the other side may be gone: finish this side at once, clean there afterwards if it answers")
    offload = sub.add_parser("offload", help="let a namespace's pods run in providers (a NamespaceOffloading)")
    offload_kinds = offload.add_subparsers(dest="kind", required=True)
    offload_ns = offload_kinds.add_parser("namespace", help="offload NS (run again to change how)")
    offload_ns.add_argument("--selector", type=_selector, metavar="SELECTOR",
                            help="the providers, by their virtual nodes' labels (e.g. 'tidepool.io/provider in (a,b)'); "
                                 "default: every provider")  # fmt: skip
    offload_ns.add_argument("--pod-strategy", choices=STRATEGIES, default="LocalAndRemote",
                            help="where NS's pods may run: here or in a provider, only in a provider, only here")
    offload_ns.add_argument("--namespace-mapping", default="DefaultName", metavar="|".join(MAPPINGS) + "[=NAME]",
                            help="the namespace's name in each provider (immutable: unoffload to change it)")
    offload_ns.add_argument("--remote-namespace", metavar="NAME", help="the name SelectedName asks for")
    unoffload = sub.add_parser("unoffload", help="drain a namespace's pods home and unoffload it")
    unoffload_ns = unoffload.add_subparsers(dest="kind", required=True).add_parser("namespace", help="unoffload NS")
    for command in (offload_ns, unoffload_ns):
        command.add_argument("namespace", metavar="NS")
        command.add_argument("--wait", action="store_true", help="until Ready (offload) or drained (unoffload)")
        command.add_argument("--timeout", type=float, default=300, metavar="SECONDS", help="of --wait")
        command.add_argument("--kubeconfig", metavar="FILE", default=None,
                             help="the consumer's (default: $KUBECONFIG, else ~/.kube/config)")
    explain = sub.add_parser("explain", help="why a peering, an Advertisement or a pool placement is as it is")
    explain.add_argument("kind", choices=["peering", "advertisement", "namespace", "pod"])
    explain.add_argument("subject", metavar="NAME",
                         help="the foreign cluster (peering), the provider (advertisement), NS (namespace), NS/NAME (pod)")
    explain.add_argument("--workflow-id", default=POOL_SCHEDULER_WORKFLOW_ID, help="the pool's scheduler workflow")
    explain.add_argument("--tenant", metavar="T", help="namespace, pod: the pool's tenant whose NS it is (needed when "
                         "several tenants have a namespace NS)")  # fmt: skip
    explain.add_argument("--kubeconfig", metavar="FILE",
                         help="pod: a consumer's kubeconfig, for a pod on a virtual node (without it: a pool pod)")
    explain.add_argument("--at", type=_timestamp, metavar="TIME",
                         help="as of then (ISO 8601, UTC unless it says otherwise), within the namespace's retention")
    simulate = sub.add_parser("simulate", help="recorded decisions replayed under another policy")
    kinds = simulate.add_subparsers(dest="kind", required=True)
    simulate_peering = kinds.add_parser("peering", help="the recorded pushes of a peering at another sharing percentage")
    simulate_peering.add_argument("subject", metavar="FOREIGN", help="the foreign cluster")
    simulate_peering.add_argument("--sharing-percentage", type=_percentage, required=True, metavar="N")
    simulate_admission = kinds.add_parser("admission", help="the recorded admission passes under AutoAcceptMax at another maximum")
    simulate_admission.add_argument("--max", type=_maximum, required=True, metavar="N", dest="maximum",
                                    help="maxAcceptableAdvertisements")  # fmt: skip
    simulate_pool = kinds.add_parser("pool", help="the recorded pool passes under another pool policy")
    simulate_pool.add_argument("--policy", choices=sorted(POLICIES), required=True,
                               help="the pool's policy (ClusterConfig spec.pool.policy); a namespace's own annotation stays")
    simulate_pool.add_argument("--workflow-id", default=POOL_SCHEDULER_WORKFLOW_ID, help="the pool's scheduler workflow")
    for command in (simulate_peering, simulate_admission, simulate_pool):
        command.add_argument("--since", type=_since, metavar="AGO|TIME", help="e.g. 24h, 30m, 7d, or an ISO 8601 time")
    for command in (explain, simulate_peering, simulate_admission):
        command.add_argument("--cluster-id", default=os.environ.get("TIDEPOOL_CLUSTER_CLUSTER_ID"),
                             help="this cluster's id (default: TIDEPOOL_CLUSTER_CLUSTER_ID)")
    for command in (explain, simulate_peering, simulate_admission, simulate_pool):
        command.add_argument("--temporal-address", help="host:port (default: TIDEPOOL_TEMPORAL_ADDRESS, else the local "
                             "environment's, else 127.0.0.1:7233)")  # fmt: skip
        command.add_argument("--namespace", help="Temporal namespace (default: TIDEPOOL_TEMPORAL_NAMESPACE, else the local "
                             "environment's for the cluster or the pool, else default)")  # fmt: skip
        command.add_argument("--state-file", type=Path, default=_local_env_state_file(),
                             help="the local environment's state, where the namespaces are found")
        command.add_argument("-o", "--output", choices=["text", "json"], default="text")
    pool = sub.add_parser("pool", help="the tenant control planes of the pool, in its management cluster")
    actions = pool.add_subparsers(dest="action", required=True)
    add_tenant = actions.add_parser("add-tenant", help="register a tenant control plane (run again: renews its token, "
                                    "updates its weight)")  # fmt: skip
    add_tenant.add_argument("--tenant-kubeconfig", metavar="FILE", required=True,
                            help="an administrator's kubeconfig of the tenant: mints the pool's identity there")
    add_tenant.add_argument("--weight", type=int, default=1, metavar="N",
                            help=f"its share of the pool under contention, 1 to {MAX_WEIGHT} (default 1)")
    add_tenant.add_argument("--server", metavar="URL",
                            help="the tenant's API server as the pool reaches it (default: the one in --tenant-kubeconfig)")
    remove_tenant = actions.add_parser("remove-tenant", help="delete a Tenant: every super cluster drains it, then its "
                                       "Secret (and, with --tenant-kubeconfig, its identity) goes")  # fmt: skip
    remove_tenant.add_argument("--wait", action="store_true", help="until every super cluster has let it go")
    remove_tenant.add_argument("--timeout", type=_duration, default=600, metavar="DURATION",
                               help="of --wait: seconds, or 30s, 10m, 1h (default 10m)")
    remove_tenant.add_argument("--tenant-kubeconfig", metavar="FILE",
                               help="an administrator's kubeconfig of the tenant: revokes the pool's identity there")
    for command in (add_tenant, remove_tenant):
        command.add_argument("name", metavar="NAME", help="the Tenant (a DNS label)")
        command.add_argument("--kubeconfig", metavar="FILE", default=None,
                             help="the pool's management cluster (default: $KUBECONFIG, else ~/.kube/config)")
    args = parser.parse_args(argv)
    if args.command == "pool":
        return _pool(parser, args)
    if args.command == "unpeer":
        on_provider, on_consumer = (args.provider, args.consumer_id), (args.consumer, args.provider_id)
        if all(on_provider) == all(on_consumer) or (any(on_provider) and any(on_consumer)):
            parser.error("unpeer: give either --provider and --consumer-id (on the provider) or --consumer and "
                         "--provider-id (on the consumer)")  # fmt: skip
    if args.command in ("offload", "unoffload"):
        return _offload(parser, args)
    if args.command in ("explain", "simulate"):
        problem = _history_arguments_problem(args)
        if problem:
            parser.error(f"{args.command} {args.kind}: {problem}")
        code = 0
        try:
            temporal = WorkerSettings.from_env(os.environ).temporal
            answer = asyncio.run(_answer(args, temporal))
            print(answer.model_dump_json(indent=2) if args.output == "json" else answer.render(), end="\n" if args.output == "json" else "")
        except NoHistory as e:
            _, source = _temporal_settings(args, temporal)
            print(f"tidepool {args.command}: {e}\n  the namespace came from {source}; give the cluster's own with "
                  "--namespace NS (and --temporal-address HOST:PORT)", file=sys.stderr)  # fmt: skip
            code = 1
        except (LookupError, RPCError, RuntimeError, OSError) as e:  # Temporal unreachable or refusing; no such pod
            print(f"tidepool {args.command}: {e}", file=sys.stderr)
            code = 1
        # The Temporal client's Rust threads can outlive the event loop and abort interpreter finalization
        # (SIGABRT, "PyGILState_Release ... finalizing": temporalio/sdk-python#300), turning an answer already
        # printed into a crash: a short-lived command leaves without finalizing.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    elif args.command == "status":
        print(status(_clusters(args)), end="")
    elif args.command == "peer":
        try:
            request_peering(client_from_own_kubeconfig_file(args.provider), client_from_own_kubeconfig_file(args.consumer),
                            provider_id=args.provider_id, consumer_id=args.consumer_id,
                            token_lifetime_seconds=args.token_lifetime, consumer_server=args.consumer_server)  # fmt: skip
        except RuntimeError as e:  # the previous request of that name still withdrawing
            print(f"tidepool peer: {e}", file=sys.stderr)
            return 1
        print(f"identity for {args.provider_id} minted on the consumer; PeeringRequest {args.consumer_id} written "
              "on the provider")  # fmt: skip
    elif args.provider:
        cancel_peering(client_from_own_kubeconfig_file(args.provider), consumer_id=args.consumer_id, force=args.force)
        print(f"PeeringRequest {args.consumer_id} deleted; the provider withdraws"
              + (" at home at once, and from the consumer when it answers" if args.force else ""))
    else:
        leave_provider(client_from_own_kubeconfig_file(args.consumer), provider_id=args.provider_id, force=args.force)
        print(f"{args.provider_id}'s identity revoked and its Advertisement deleted; the consumer tears down"
              + (" here at once, and cleans in the provider when it answers" if args.force else " in order"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
