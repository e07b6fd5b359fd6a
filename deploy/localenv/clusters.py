"""Real Kubernetes clusters side by side on 127.0.0.1: kwokctl's binary runtime runs etcd,
kube-apiserver, kube-controller-manager, kube-scheduler and the kwok controller (which keeps fake nodes
Ready and moves their pods to Running) as local processes. Each cluster has its own kubeconfig.
Used by the local environment (demo and tests)."""

from __future__ import annotations

import base64
import ipaddress
import itertools
import os
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from deploy.localenv.binaries import Binaries
from kube.objects import apply_cluster_object, apply_core
from models.names import API_VERSION, SUPER_CLUSTERS, SYSTEM_NAMESPACE
from models.times import format_micro_time

CRD_DIR = Path(__file__).resolve().parents[1] / "crds"
NAMESPACE = Path(__file__).resolve().parents[1] / "base" / "namespace.yaml"
# The consumer's decisions policy: a provider's identity may not write them (issue 34). Installed with the CRDs
# on every local cluster, as deploy/base installs it in production, so that the providers of tests and of
# `make demo` meet it as they would there.
CONSUMER_DECISIONS = Path(__file__).resolve().parents[1] / "base" / "consumer-decisions.yaml"
CONSUMER_OFFLOADING = Path(__file__).resolve().parents[1] / "base" / "consumer-offloading.yaml"
CREATE_ATTEMPTS = 3
# kwokctl picks each component's port itself, the highest free one below 32768, and binds it only later:
# two processes creating clusters at once (parallel test workers) pick the same ports, and a stopped
# cluster's ports go to the next cluster created. So every process hands out ports of its own: the range
# in TIDEPOOL_CLUSTER_PORTS ("first-last"; each parallel test worker has its own), below Linux's
# ephemeral ports, which anything else bound to port 0 gets.
CLUSTER_PORTS_ENV = "TIDEPOOL_CLUSTER_PORTS"
DEFAULT_CLUSTER_PORTS = (20000, 20999)
_PORT_OPTIONS = ("kubeApiserverPort", "etcdPort", "etcdPeerPort", "kubeControllerManagerPort",
                 "kubeSchedulerPort", "kwokControllerPort")  # fmt: skip
# Each fake node's share of its cluster's PodCIDR (node IPAM's default for IPv4, 254 pods).
NODE_POD_CIDR_PREFIX = 24


@dataclass(frozen=True)
class LocalCluster:
    name: str
    kubeconfig: Path

    def api_client(self) -> k8s.ApiClient:
        api: k8s.ApiClient = k8s_config.new_client_from_config(config_file=str(self.kubeconfig))
        return api

    @property
    def server(self) -> str:
        config = yaml.safe_load(self.kubeconfig.read_text())
        return str(config["clusters"][0]["cluster"]["server"])

    @property
    def api_server_port(self) -> int:
        """The port its API server listens on (on loopback)."""
        return int(self.server.rsplit(":", 1)[1])

    @property
    def fake_pods(self) -> FakePodFiles:
        return FakePodFiles.of(self.name, workdir=self.workdir)

    @property
    def workdir(self) -> Path:
        # The kubeconfig is <workdir>/kubeconfigs/<name>.yaml (_write_kubeconfig).
        return self.kubeconfig.parent.parent

    @property
    def pki(self) -> Path:
        """kwokctl's PKI of the cluster: its CA (ca.crt, ca.key) and the admin's certificate."""
        return _cluster_dir(self.name, self.workdir) / "pki"


@dataclass(frozen=True)
class FakePodFiles:
    """What kwok's fake pods of one cluster serve to kubectl (the ClusterLogs, ClusterExec and ClusterAttach
    documents of `_kwokctl_config`): every container's log is `logs` and its previous log `previous_logs`;
    attach shows the lines appended to `attach_logs` after it starts; exec runs the command on this machine
    in `directory`. Log files hold CRI log lines (`cri_log_line`): kwok skips any other line. Every port
    of a fake pod echoes what it receives (port-forward runs `cat`)."""

    directory: Path
    logs: Path
    previous_logs: Path
    attach_logs: Path

    @classmethod
    def of(cls, name: str, *, workdir: Path) -> FakePodFiles:
        directory = _cluster_dir(name, workdir) / "fake-pods"
        return cls(directory=directory, logs=directory / "pod.log", previous_logs=directory / "previous.log",
                   attach_logs=directory / "attach.log")  # fmt: skip

    def create(self, cluster: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.logs.write_text(cri_log_line(f"fake pod of cluster {cluster} started"))
        self.previous_logs.write_text(cri_log_line(f"fake pod of cluster {cluster}, previous run"))
        self.attach_logs.write_text("")


def cri_log_line(text: str, *, stream: str = "stdout") -> str:
    """One line in the CRI log format, the one kwok's fake logs read (time, stream, F for a full line)."""
    now = format_micro_time(datetime.now(UTC))
    return f"{now} {stream} F {text}\n"


def _cluster_dir(name: str, workdir: Path) -> Path:
    return workdir / "clusters" / name


def _kwokctl_env(binaries: Binaries, workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["KWOK_WORKDIR"] = str(workdir)
    # kwokctl calls kubectl by name; ours goes first so that the pinned version answers.
    env["PATH"] = f"{binaries.kubectl_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def _kwokctl_config(binaries: Binaries, *, name: str, workdir: Path, fake_pods: FakePodFiles,
                    scheduler: bool = True, node_lifecycle: bool = True) -> list[dict[str, Any]]:  # fmt: skip
    """kwokctl's configuration and the kwok documents that make fake pods serve logs, exec, attach and
    port-forward (FakePodFiles). ClusterExec runs any command on this machine as the kwok controller's user
    for whoever may exec in the cluster: for local clusters only."""
    fakes_meta = {"name": "fake-pods"}
    kwok_api = "kwok.x-k8s.io/v1alpha1"
    fakes: list[dict[str, Any]] = [
        {"kind": "ClusterLogs", "apiVersion": kwok_api, "metadata": fakes_meta,
         "spec": {"logs": [{"logsFile": str(fake_pods.logs), "previousLogsFile": str(fake_pods.previous_logs)}]}},
        {"kind": "ClusterExec", "apiVersion": kwok_api, "metadata": fakes_meta,
         "spec": {"execs": [{"local": {"workDir": str(fake_pods.directory),
                                       "envs": [{"name": "TIDEPOOL_FAKE_POD_CLUSTER", "value": name}]}}]}},
        {"kind": "ClusterAttach", "apiVersion": kwok_api, "metadata": fakes_meta,
         "spec": {"attaches": [{"logsFile": str(fake_pods.attach_logs)}]}},
        {"kind": "ClusterPortForward", "apiVersion": kwok_api, "metadata": fakes_meta,
         "spec": {"forwards": [{"command": ["cat"]}]}},
    ]  # fmt: skip
    options = _kwokctl_options(binaries, pki=_cluster_dir(name, workdir) / "pki", ports=_free_ports(), scheduler=scheduler,
                               node_lifecycle=node_lifecycle)  # fmt: skip
    return [options, *fakes]


_port_cursor: dict[tuple[int, int], int] = {}


def cluster_port_range(environ: dict[str, str] | os._Environ[str] = os.environ) -> tuple[int, int]:
    raw = environ.get(CLUSTER_PORTS_ENV)
    if not raw:
        return DEFAULT_CLUSTER_PORTS
    first, sep, last = raw.partition("-")
    if not (sep and first.isdigit() and last.isdigit() and 1024 <= int(first) <= int(last) <= 65535):
        raise ValueError(f"{CLUSTER_PORTS_ENV}={raw!r}: expected FIRST-LAST, ports from 1024 to 65535")
    return int(first), int(last)


def _free_ports() -> dict[str, int]:
    return dict(zip(_PORT_OPTIONS, free_ports(len(_PORT_OPTIONS)), strict=True))


def free_ports(count: int) -> list[int]:
    """`count` ports for local components (a cluster's, a real node's kubelet), the next free ones of this
    process's range, going round: free means bindable as the components bind (SO_REUSEADDR, as Go does),
    so that a port left in TIME_WAIT counts as free and one held for a stopped cluster (`stop_cluster`) or
    serving does not."""
    first, last = cluster_port_range()
    size = last - first + 1
    if size < count:
        raise ValueError(f"{CLUSTER_PORTS_ENV}: {size} ports are fewer than the {count} asked")
    cursor = _port_cursor.get((first, last), 0)
    ports: list[int] = []
    for step in range(size):
        port = first + (cursor + step) % size
        holder = _hold(port, reuse=True)
        if holder is not None:
            holder.close()
            ports.append(port)
            if len(ports) == count:
                _port_cursor[(first, last)] = (cursor + step + 1) % size
                return ports
    raise RuntimeError(f"fewer than {count} free ports in {first}-{last} ({CLUSTER_PORTS_ENV})")


def _kwokctl_options(binaries: Binaries, *, pki: Path, ports: dict[str, int], scheduler: bool = True,
                     node_lifecycle: bool = True) -> dict[str, Any]:  # fmt: skip
    # The API server presents a client certificate to kubelets (kwokctl's admin one, made at create), so
    # that a virtual kubelet's API authenticates it as in production; kwok's own kubelet API checks none,
    # and fake nodes serve as before. In the file, not as --extra-args: kwokctl 0.8 indexes those wrongly
    # (a panic) when they name more than one component.
    # A real node (deploy/localenv/realnode.py) is reached at its InternalIP, its Hostname resolving
    # nowhere; kwok's fake nodes give only a Hostname (localhost) and tidepool's only an InternalIP, so
    # putting InternalIP first changes nothing for them.
    apiserver_args = {"kubelet-client-certificate": pki / "admin.crt", "kubelet-client-key": pki / "admin.key",
                      "kubelet-preferred-address-types": "InternalIP,Hostname,InternalDNS,ExternalDNS,ExternalIP"}
    # One controller manager and one scheduler per cluster: no leader election, whose Lease renewal every 2 s
    # each was most of an idle cluster's work (tests run a dozen clusters at once).
    alone = {"key": "leader-elect", "value": "false"}
    manager = [alone, *([] if node_lifecycle else [{"key": "controllers", "value": "*,-node-lifecycle-controller"}])]
    patches = [{"name": "kube-apiserver", "extraArgs": [{"key": k, "value": str(v)} for k, v in apiserver_args.items()]},
               {"name": "kube-controller-manager", "extraArgs": manager}]
    if scheduler:
        patches.append({"name": "kube-scheduler", "extraArgs": [alone]})
    return {
        "kind": "KwokctlConfiguration",
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "options": {
            "runtime": "binary",
            "bindAddress": "127.0.0.1",  # kwokctl's default is 0.0.0.0
            "etcdBinary": str(binaries.etcd),
            "kubeApiserverBinary": str(binaries.kube_apiserver),
            "kubeControllerManagerBinary": str(binaries.kube_controller_manager),
            "kubeSchedulerBinary": str(binaries.kube_scheduler),
            "kwokControllerBinary": str(binaries.kwok),
            # A tenant control plane of the pool runs none: the pool schedules its pods (docs/pool.md).
            "disableKubeScheduler": not scheduler,
            "kubectlBinary": str(binaries.kubectl),
            **ports,
        },
        "componentsPatches": patches,
    }


def create_cluster(name: str, *, binaries: Binaries, workdir: Path, scheduler: bool = True,
                   node_lifecycle: bool = True) -> LocalCluster:  # fmt: skip
    """Creates (or adopts, when it already runs) cluster `name` and installs tidepool's CRDs. `scheduler`:
    whether it runs a kube-scheduler (a pool's tenant control plane does not); `node_lifecycle`: whether its
    controller manager marks nodes NotReady and taints them (off for nodes that nothing keeps Ready)."""
    workdir.mkdir(parents=True, exist_ok=True)
    fake_pods = FakePodFiles.of(name, workdir=workdir)
    config_file = workdir / f"kwokctl-{name}.yaml"
    kubeconfig = workdir / f"kubeconfig-{name}.yaml"
    env = _kwokctl_env(binaries, workdir)
    log = workdir / f"kwokctl-{name}.log"
    command = [
        str(binaries.kwokctl), "create", "cluster", "--name", name, "--config", str(config_file),
        "--kubeconfig", str(kubeconfig), "--timeout", "90s", "--wait", "90s",
        # kwok fakes only the nodes annotated as fake: tidepool's virtual nodes are run by its own
        # virtual kubelet, whose conditions and pods kwok must not touch.
        "--extra-args", "kwok-controller=manage-all-nodes=false",
        "--extra-args", "kwok-controller=manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
    ]  # fmt: skip
    for _ in range(CREATE_ATTEMPTS):
        fake_pods.create(name)  # again after a failed attempt: deleting the cluster removes its directory
        config = _kwokctl_config(binaries, name=name, workdir=workdir, fake_pods=fake_pods, scheduler=scheduler,
                                 node_lifecycle=node_lifecycle)  # fresh ports each time
        config_file.write_text(yaml.safe_dump_all(config))
        with open(log, "ab") as out:
            created = subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if created.returncode == 0:
            cluster = LocalCluster(name=name, kubeconfig=_write_kubeconfig(name, binaries=binaries, workdir=workdir))
            try:
                install_crds(cluster, binaries=binaries)
                _wait_default_service_account(cluster, binaries=binaries)
                return cluster
            except subprocess.CalledProcessError:
                pass  # kwokctl gave up waiting and said yes: its port may be another cluster's (see below)
        # A port taken between `_free_ports` and the component binding it makes etcd or the API server
        # fail: a fresh start has fresh ports.
        delete_cluster(name, binaries=binaries, workdir=workdir)
    raise RuntimeError(f"kwokctl could not create cluster {name} in {CREATE_ATTEMPTS} attempts; see {log}")


def _write_kubeconfig(name: str, *, binaries: Binaries, workdir: Path) -> Path:
    """The cluster's own kubeconfig in a file of its own (kwokctl's shared one holds every context)."""
    out = subprocess.run(
        [str(binaries.kwokctl), "get", "kubeconfig", "--name", name],
        env=_kwokctl_env(binaries, workdir), check=True, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    path = workdir / "kubeconfigs" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(out.stdout)
    return path


def delete_cluster(name: str, *, binaries: Binaries, workdir: Path) -> None:
    subprocess.run(
        [str(binaries.kwokctl), "delete", "cluster", "--name", name],
        env=_kwokctl_env(binaries, workdir), check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


# Ports of stopped clusters, held by sockets bound but not listening: connections are refused as if
# nothing were there, and no cluster created meanwhile (kwokctl picks free ports) can take them.
_HELD_PORTS: dict[str, list[socket.socket]] = {}


def _ports(name: str, workdir: Path) -> set[int]:
    config = list(yaml.safe_load_all((workdir / "clusters" / name / "kwok.yaml").read_text()))
    options = next(d for d in config if isinstance(d, dict) and d.get("kind") == "KwokctlConfiguration")["options"]
    return {v for k, v in options.items() if k.endswith("Port") and isinstance(v, int) and v >= 1024}


def _hold(port: int, *, reuse: bool) -> socket.socket | None:
    """A socket bound to `port`, not listening. Without SO_REUSEADDR nobody else can bind the port; but
    the components' connections may leave it in TIME_WAIT, and then only a socket with it binds (a
    weaker hold: another SO_REUSEADDR socket may bind too). None when someone holds the port already."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if reuse:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        holder.bind(("127.0.0.1", port))
    except OSError:
        holder.close()
        return None
    return holder


def _kwokctl_logged(verb: str, name: str, *, binaries: Binaries, workdir: Path) -> None:
    """`kwokctl <verb> cluster`, its output in the cluster's kwokctl log (as its creation's) and named on failure."""
    log = workdir / f"kwokctl-{name}.log"
    with open(log, "ab") as out:
        done = subprocess.run([str(binaries.kwokctl), verb, "cluster", "--name", name], env=_kwokctl_env(binaries, workdir),
                              stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"kwokctl {verb} cluster {name}: exit status {done.returncode}; see {log}")


def stop_cluster(name: str, *, binaries: Binaries, workdir: Path, timeout: float = 60) -> None:
    """Stops every component of the cluster (etcd, API server, ...), keeping its data and its ports: its
    API server refuses connections until `start_cluster`. Used by the fault tests."""
    pids = [int(f.read_text().strip()) for f in (workdir / "clusters" / name / "pids").glob("*.pid")]
    _kwokctl_logged("stop", name, binaries=binaries, workdir=workdir)
    # kwokctl only signals them: until they have exited, their ports are taken and a start fails.
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids), timeout=timeout,
             what=f"the components of cluster {name} to exit")  # fmt: skip
    held = []
    for port in _ports(name, workdir):
        holder = _hold(port, reuse=False) or _hold(port, reuse=True)
        if holder is not None:
            held.append(holder)
    _HELD_PORTS[name] = held


def start_cluster(cluster: LocalCluster, *, binaries: Binaries, workdir: Path, timeout: float = 90) -> None:
    """Starts a stopped cluster again, on the same ports with the same data, and waits until it serves."""
    for holder in _HELD_PORTS.pop(cluster.name, []):
        holder.close()
    _kwokctl_logged("start", cluster.name, binaries=binaries, workdir=workdir)

    def serving() -> bool:
        try:
            k8s.CoreV1Api(cluster.api_client()).list_namespace(limit=1)
            return True
        except Exception:  # noqa: BLE001 - not yet
            return False

    try:
        wait_for(serving, timeout=timeout, what=f"cluster {cluster.name} to serve again", interval=0.5)
    except TimeoutError as e:  # what the components said is the only trace: the state directory goes with the test
        raise TimeoutError(f"{e}\n{_log_tails(workdir / 'clusters' / cluster.name / 'logs')}") from None


def _log_tails(logs: Path, *, lines: int = 8) -> str:
    tails = []
    for name in ("etcd.log", "kube-apiserver.log"):
        path = logs / name
        text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else ["(no log)"]
        tails.append(f"--- {name}, last lines:\n" + "\n".join(text))
    return "\n".join(tails)


def certify_address(cluster: LocalCluster, address: str, *, binaries: Binaries, timeout: float = 30) -> None:
    """Makes the API server's certificate name `address` as well, as a real cluster's names its `kubernetes`
    Service's ClusterIP, which in-cluster clients dial (kwokctl's names this machine's own addresses only).
    The certificate is issued again under the same key, subject and CA (it is the admin's client certificate
    too, and the API server's to kubelets), then the cluster restarts: an API server that noticed the change
    by itself would drop its first connection to each kubelet ("use of closed network connection").
    Idempotent. With openssl: the cryptography package refuses kwokctl's CA certificate (its serial is 0)."""
    pki = cluster.pki
    certificate, key = pki / "admin.crt", pki / "admin.key"
    names = _alternative_names(certificate)
    if f"IP:{address}" not in names:
        extensions = pki / "admin.ext"
        extensions.write_text("keyUsage = critical, digitalSignature, keyEncipherment\n"
                              "extendedKeyUsage = anyExtendedKeyUsage, serverAuth, clientAuth\n"
                              "basicConstraints = critical, CA:FALSE\n"
                              f"subjectAltName = {', '.join([*names, f'IP:{address}'])}\n")  # fmt: skip
        request, issued = pki / "admin.csr", pki / "admin.crt.new"
        subprocess.run(["openssl", "x509", "-x509toreq", "-in", str(certificate), "-signkey", str(key),
                        "-out", str(request)], check=True, capture_output=True)  # fmt: skip
        subprocess.run(["openssl", "x509", "-req", "-in", str(request), "-CA", str(pki / "ca.crt"),
                        "-CAkey", str(pki / "ca.key"), "-set_serial", f"0x{os.urandom(16).hex()}", "-days", "3650",
                        "-extfile", str(extensions), "-out", str(issued)], check=True, capture_output=True)  # fmt: skip
        os.replace(issued, certificate)  # whole: nothing reads half a file
        stop_cluster(cluster.name, binaries=binaries, workdir=cluster.workdir)
        start_cluster(cluster, binaries=binaries, workdir=cluster.workdir)
    def served() -> bool:
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        try:
            with socket.create_connection(("127.0.0.1", cluster.api_server_port), timeout=5) as raw, \
                    context.wrap_socket(raw, server_hostname=address):  # fmt: skip
                return True
        except (OSError, ssl.SSLError):
            return False

    wait_for(served, timeout=timeout, what=f"the API server of {cluster.name} to serve a certificate for {address}",
             interval=0.5)  # fmt: skip


def _alternative_names(certificate: Path) -> list[str]:
    """The certificate's subjectAltName entries as openssl's configuration writes them (DNS:x, IP:y)."""
    shown = subprocess.run(["openssl", "x509", "-in", str(certificate), "-noout", "-ext", "subjectAltName"],
                           check=True, capture_output=True, text=True).stdout.splitlines()[1:]  # fmt: skip
    entries = [e.strip() for line in shown for e in line.split(",") if e.strip()]
    return [e.replace("IP Address:", "IP:", 1) for e in entries]


def install_crds(cluster: LocalCluster, *, binaries: Binaries) -> None:
    """Server-side apply of deploy/crds, of tidepool's namespace (where its workers hold their Lease) and of
    the consumer's decisions and offloading policies, as a production install does (deploy/base), then wait
    until the API server serves the CRDs (the offloading MutatingAdmissionPolicy's paramKind is one of them)."""
    if not any(CRD_DIR.glob("*.yaml")):
        return
    kubectl = [str(binaries.kubectl), "--kubeconfig", str(cluster.kubeconfig)]
    subprocess.run([*kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(CRD_DIR), "-f", str(NAMESPACE),
                    "-f", str(CONSUMER_DECISIONS), "-f", str(CONSUMER_OFFLOADING)], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    subprocess.run([*kubectl, "wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRD_DIR)],
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip


def _wait_default_service_account(cluster: LocalCluster, *, binaries: Binaries) -> None:
    """Pods are refused until the controller-manager has made the namespace's `default` ServiceAccount,
    which under load comes seconds after the API server answers."""
    subprocess.run([str(binaries.kubectl), "--kubeconfig", str(cluster.kubeconfig), "wait", "--for=create",
                    "--timeout=60s", "-n", "default", "serviceaccount/default"], check=True, stdout=subprocess.DEVNULL)  # fmt: skip


def fake_node(
    name: str, *, cpu: str, memory: str, pods: str = "110", labels: dict[str, str] | None = None,
    pod_cidr: str | None = None,
) -> dict[str, Any]:
    """A Node that the kwok controller keeps Ready (it manages nodes annotated kwok.x-k8s.io/node=fake).
    kwok gives its pods IPs from `pod_cidr` (spec.podCIDR), or, without one, from its own default
    10.0.0.0/24, the same in every cluster (`node_pod_cidrs` gives a cluster's nodes blocks of its own)."""
    allocatable = {"cpu": cpu, "memory": memory, "pods": pods}
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **(labels or {})},
        },
        "status": {"allocatable": allocatable, "capacity": allocatable, "phase": "Running"},
    }
    if pod_cidr:
        node["spec"] = {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]}
    return node


def node_pod_cidrs(cluster_pod_cidr: str, count: int, *, prefix: int = NODE_POD_CIDR_PREFIX) -> list[str]:
    """The first `count` blocks of size /`prefix` of the cluster's PodCIDR, one per fake node, in order: what
    the controller-manager's node IPAM would give them. Set at the nodes' creation rather than left to node
    IPAM (--allocate-node-cidrs): kwok reads a node's podCIDR when a pod starts, and a pod scheduled before
    the allocation would get kwok's default block; node IPAM would also give the virtual nodes blocks their
    pods never use (their IPs are the provider's, remapped)."""
    try:
        network = ipaddress.ip_network(cluster_pod_cidr, strict=True)
    except ValueError as e:
        raise ValueError(f"cluster_pod_cidr {cluster_pod_cidr!r} is not a CIDR: {e}") from None
    if prefix < network.prefixlen:
        raise ValueError(f"prefix /{prefix} is wider than the cluster's PodCIDR {network}")
    if count < 0:
        raise ValueError(f"count must be 0 or more, got {count}")
    cidrs = [str(block) for block in itertools.islice(network.subnets(new_prefix=prefix), count)]
    if len(cidrs) < count:
        raise ValueError(f"count {count}: the cluster's PodCIDR {network} holds only {len(cidrs)} /{prefix} blocks")
    return cidrs


def wait_for(predicate: Any, *, timeout: float, what: str, interval: float = 0.2) -> Any:
    """Polls `predicate` until it returns something truthy; raises TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def join_pool(tenant: k8s.ApiClient, name: str, kubeconfig: Path, *, headroom: dict[str, str] | None = None) -> None:
    """What a pool's operator does to add a super cluster: its kubeconfig as a Secret in the tenant control
    plane's tidepool-system (which must exist), and a SuperCluster naming it. Idempotent (applied)."""
    apply_core(tenant, {"apiVersion": "v1", "kind": "Secret",
                        "metadata": {"name": f"super-{name}", "namespace": SYSTEM_NAMESPACE},
                        "data": {"kubeconfig": base64.b64encode(kubeconfig.read_bytes()).decode()}})  # fmt: skip
    spec: dict[str, Any] = {"kubeConfigRef": {"name": f"super-{name}", "namespace": SYSTEM_NAMESPACE}}
    if headroom:
        spec["headroom"] = headroom
    apply_cluster_object(tenant, SUPER_CLUSTERS, {"apiVersion": API_VERSION, "kind": "SuperCluster",
                                                  "metadata": {"name": name}, "spec": spec})  # fmt: skip
