"""A real node in a local cluster: a private containerd (runc, the CNI plugins of /usr/lib/cni) and a kubelet
built from the control plane's Kubernetes module, registered beside the cluster's kwok nodes. Its pods are
processes; images come from Podman (`podman save`, `ctr import`), none from a registry.

Everything of one node lives under <workdir>/realnodes/<cluster>/<name>/: containerd's config, root, state and
socket, the CNI network (a bridge of its own on a /24 of REAL_NODE_POD_NETWORK that no host route takes),
the kubelet's root, config and credentials (a client certificate for system:node:<name> signed by the
cluster's CA). `RealNode.stop` (and `stop_real_nodes`, from the environment's `down`) kills the
containers, unmounts what they mounted and ends every process the node started.

The machines here have cgroups v1: the kubelet runs with the cgroupfs driver, without QoS cgroups or node
allocatable enforcement (docs/development.md says what it takes). Used by the realnode tests."""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import secrets
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from deploy.containers.podman import podman
from deploy.localenv.binaries import ensure_binaries, ensure_kubelet
from deploy.localenv.clusters import LocalCluster, certify_address, free_ports, wait_for
from deploy.localenv.temporal import stop_process_group

# Pod addresses of real nodes, one /24 each: outside every CIDR the tests and the demo give clusters,
# Services and fake nodes (10.0-10.3, 10.9, 10.96, 10.200, 100.64-100.65, 192.168) and Podman's 10.88.
REAL_NODE_POD_NETWORK = ipaddress.IPv4Network("10.244.0.0/16")
CONTAINERD_NAMESPACE = "k8s.io"  # the CRI plugin's
CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
READY_TIMEOUT = 90.0  # seconds from the kubelet's start to a Ready node; a few here
CERTIFICATE_DAYS = 7
MAX_SOCKET_PATH = 107  # bytes of a Unix socket's path (sun_path less its NUL)
# A kubelet runs under a supervisor that starts it again (systemd's Restart=always): one that ends while it
# starts is started again, once (seen once in CI: ended at its start, before it wrote a line).
KUBELET_STARTS = 2
log = logging.getLogger("tidepool.realnode")


class KubeletExited(RuntimeError):
    """The node's kubelet ended before its node was Ready."""


@dataclass(frozen=True)
class RealNode:
    name: str
    directory: Path
    node_ip: str
    kubelet_port: int
    pod_cidr: str
    bridge: str

    @property
    def containerd_socket(self) -> Path:
        return _containerd_socket(self.directory)

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """containerd's own CLI on this node's containerd, in the CRI plugin's namespace."""
        return _ctr(self.containerd_socket, *args, check=check)

    def containers(self, *, pod_uid: str | None = None) -> list[str]:
        """Ids of the containers containerd holds (the pods' and their sandboxes'), or those of one pod."""
        selector = [f'labels."io.kubernetes.pod.uid"=={pod_uid}'] if pod_uid else []
        return self.ctr("containers", "list", "--quiet", *selector).stdout.split()

    def running(self, *, pod_uid: str) -> list[str]:
        """Ids of one pod's containers whose process still runs (containerd's tasks), sandbox included."""
        ours = set(self.containers(pod_uid=pod_uid))
        tasks = self.ctr("tasks", "list").stdout.splitlines()[1:]  # TASK PID STATUS, under a header
        return [fields[0] for fields in map(str.split, tasks) if fields and fields[0] in ours and fields[-1] == "RUNNING"]

    def import_image(self, tag: str) -> None:
        """A Podman image into containerd, under the same name (referenced with imagePullPolicy Never)."""
        archive = self.directory / "images" / (re.sub(r"[^A-Za-z0-9_.-]", "_", tag) + ".tar")
        archive.parent.mkdir(parents=True, exist_ok=True)
        podman("save", "--format", "docker-archive", "-o", str(archive), tag)
        try:
            self.ctr("images", "import", str(archive))
        finally:
            archive.unlink(missing_ok=True)

    def stop(self) -> None:
        stop_real_node(self.directory)


def start_real_node(cluster: LocalCluster, *, name: str, images: list[str], pause_image: str,
                    node_ip: str | None = None, taints: list[dict[str, str]] | None = None,
                    sync_frequency_seconds: int | None = None) -> RealNode:  # fmt: skip
    """Starts containerd and a kubelet registering node `name` in `cluster` (with `taints`, as a kubelet's
    registerWithTaints), with `images` (Podman tags) imported, and waits until the node is Ready. Builds the
    kubelet the first time (minutes). `sync_frequency_seconds`: the kubelet's pod sync (syncFrequency, 1
    minute by default), which paces, among others, how soon a changed Secret reaches its volumes."""
    kubelet = ensure_kubelet()
    directory = cluster.workdir / "realnodes" / cluster.name / name
    longest = directory / "kubelet" / "device-plugins" / "kubelet.sock"  # the kubelet's own, in its root dir
    if len(str(longest)) > MAX_SOCKET_PATH:
        raise ValueError(f"{longest}: {len(str(longest))} characters, more than a Unix socket's {MAX_SOCKET_PATH}; "
                         "give the environment a shorter state directory")  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    (kubelet_port,) = free_ports(1)
    node_ip = node_ip or host_address()
    pod_cidr, bridge = _reserve_pod_network()
    (directory / "node.json").write_text(json.dumps({"bridge": bridge}))  # for stop_real_node
    node = RealNode(name=name, directory=directory, node_ip=node_ip, kubelet_port=kubelet_port, pod_cidr=str(pod_cidr),
                    bridge=bridge)  # fmt: skip
    try:
        _reach_this_machine(node, cluster=cluster)
        _start_containerd(node, pause_image=pause_image)
        for tag in [pause_image, *images]:
            node.import_image(tag)
        for start in range(KUBELET_STARTS):
            _start_kubelet(node, cluster=cluster, kubelet=kubelet, taints=taints or [],
                           sync_frequency_seconds=sync_frequency_seconds)  # fmt: skip
            try:
                _wait_ready(node, cluster=cluster)
                break
            except KubeletExited as e:
                if start == KUBELET_STARTS - 1:
                    raise
                log.warning("node %s: %s; started again, as its systemd unit would", node.name, e)
    except BaseException:
        node.stop()
        raise
    return node


def host_address() -> str:
    """This machine's own address (the source of its default route): the node's InternalIP, which the API
    server dials for logs and exec and which must not be loopback."""
    # Any address off this machine will do: `ip route get` sends nothing.
    route = json.loads(subprocess.run(["ip", "-j", "-4", "route", "get", "1.1.1.1"], check=True,
                                      capture_output=True, text=True).stdout)  # fmt: skip
    return str(route[0]["prefsrc"])


def _reach_this_machine(node: RealNode, *, cluster: LocalCluster) -> None:
    """What kube-proxy and a routed network give pods elsewhere, for this node's pods: the `kubernetes`
    Service's ClusterIP (which in-cluster clients dial, and which the API server's certificate is made to name)
    reaches the cluster's API server, and this machine's address reaches whatever listens on its loopback,
    where the local environment binds every server (another cluster's API server, Temporal). NAT rules for
    what enters from the node's bridge only, removed with the node (`stop_real_node`)."""
    service = k8s.CoreV1Api(cluster.api_client()).read_namespaced_service("kubernetes", "default").spec
    assert service is not None and service.cluster_ip is not None
    certify_address(cluster, service.cluster_ip, binaries=ensure_binaries())
    # Loopback as a destination from outside it: what a DNAT to 127.0.0.1 needs.
    Path(f"/proc/sys/net/ipv4/conf/{node.bridge}/route_localnet").write_text("1")
    for match, target in ((["-d", service.cluster_ip, "-p", "tcp", "--dport", "443"], f"127.0.0.1:{cluster.api_server_port}"),
                          (["-d", node.node_ip, "-p", "tcp"], "127.0.0.1")):  # fmt: skip
        subprocess.run(["iptables", "-t", "nat", "-A", "PREROUTING", "-i", node.bridge, *match, "-m", "comment",
                        "--comment", _rule_comment(node.bridge), "-j", "DNAT", "--to-destination", target],
                       check=True, capture_output=True)  # fmt: skip


def _rule_comment(bridge: str) -> str:
    return f"tidepool real node {bridge}"


def _remove_rules(bridge: str) -> None:
    rules = subprocess.run(["iptables", "-t", "nat", "-S", "PREROUTING"], check=False, capture_output=True,
                           text=True).stdout.splitlines()  # fmt: skip
    for rule in rules:
        if f'"{_rule_comment(bridge)}"' in rule and rule.startswith("-A "):
            subprocess.run(["iptables", "-t", "nat", "-D", *shlex.split(rule)[1:]], check=False, capture_output=True)


def _reserve_pod_network() -> tuple[ipaddress.IPv4Network, str]:
    """The first /24 of REAL_NODE_POD_NETWORK that no route of this machine covers, and its bridge, made here
    with the pods' gateway address: creating the bridge is what reserves the block (it fails when another
    node, of this run or another, took it meanwhile), and its route keeps the block from the next node."""
    routes = json.loads(subprocess.run(["ip", "-j", "-4", "route", "show"], check=True, capture_output=True,
                                       text=True).stdout)  # fmt: skip
    taken = [ipaddress.ip_network(r["dst"]) for r in routes if r["dst"] != "default"]
    for index, block in enumerate(REAL_NODE_POD_NETWORK.subnets(new_prefix=24)):
        if any(block.overlaps(t) for t in taken):
            continue
        bridge = f"tprn{index}"
        if subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], capture_output=True).returncode != 0:
            continue
        gateway = f"{block.network_address + 1}/{block.prefixlen}"
        subprocess.run(["ip", "address", "add", gateway, "dev", bridge], check=True, capture_output=True)
        subprocess.run(["ip", "link", "set", bridge, "up"], check=True, capture_output=True)
        return block, bridge
    raise RuntimeError(f"every /24 of {REAL_NODE_POD_NETWORK} is routed already")


# The processes this one started, by pid: how one that ended says why (its exit status), and reaped.
_started: dict[int, subprocess.Popen[bytes]] = {}


def _spawn(command: list[str], *, log: Path, pid_file: Path) -> int:
    with open(log, "ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)  # fmt: skip
    pid_file.write_text(str(process.pid))
    _started[process.pid] = process
    return process.pid


def _ended(pid_file: Path) -> str:
    """How the process of `pid_file`, started here, ended: its exit status or the signal that ended it."""
    process = _started.get(int(pid_file.read_text())) if pid_file.exists() else None
    code = process.poll() if process is not None else None
    if code is None:
        return "its end not seen by this process"
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


def _start_containerd(node: RealNode, *, pause_image: str) -> None:
    base = node.directory / "containerd"
    cni = node.directory / "cni"
    (cni / "net.d").mkdir(parents=True, exist_ok=True)
    (cni / "net.d" / "10-tidepool.conflist").write_text(json.dumps({
        "cniVersion": "1.0.0", "name": f"tidepool-{node.name}",
        "plugins": [{"type": "bridge", "bridge": node.bridge, "isDefaultGateway": True, "hairpinMode": True,
                     # No masquerade: pods talk to this machine and to each other (_reach_this_machine's rules).
                     "ipMasq": False,
                     "ipam": {"type": "host-local", "ranges": [[{"subnet": node.pod_cidr}]],
                              "dataDir": str(cni / "ipam")}}],
    }, indent=1))  # fmt: skip
    cri = '"io.containerd.grpc.v1.cri"'
    # restrict_oom_score_adj and disable_apparmor: without them a sandbox fails here with "can't get final
    # child's PID from pipe" (runc may not lower its OOM score nor load an AppArmor profile on this machine).
    config = f"""version = 2
root = "{base / 'root'}"
state = "{base / 'state'}"
[grpc]
  address = "{node.containerd_socket}"
[ttrpc]
  address = "{node.containerd_socket}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{base / 'opt'}"
[plugins.{cri}]
  sandbox_image = "{pause_image}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[plugins.{cri}.containerd]
  default_runtime_name = "runc"
[plugins.{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins.{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{base / 'runc'}"
[plugins.{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{cni / 'net.d'}"
"""  # fmt: skip
    base.mkdir(parents=True, exist_ok=True)
    (base / "config.toml").write_text(config)
    _spawn(["containerd", "--config", str(base / "config.toml")], log=node.directory / "containerd.log",
           pid_file=node.directory / "containerd.pid")  # fmt: skip
    wait_for(lambda: node.ctr("version", check=False).returncode == 0, timeout=30, what="containerd to serve",
             interval=0.2)  # fmt: skip


def _node_credentials(node: RealNode, *, cluster: LocalCluster) -> tuple[Path, Path]:
    """A client certificate for system:node:<name> in group system:nodes, signed by the cluster's CA: what
    the Node authorizer lets a kubelet do, and no more (never the admin's). Made with openssl: kwokctl's
    CA certificate has a serial number of 0, which the cryptography package refuses to load (soon)."""
    pki = node.directory / "pki"
    pki.mkdir(parents=True, exist_ok=True)
    cert_file, key_file, request = pki / "node-client.crt", pki / "node-client.key", pki / "node-client.csr"
    usage = pki / "node-client.ext"
    usage.write_text("extendedKeyUsage = clientAuth\n")
    subprocess.run(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key_file), "-subj", f"/O=system:nodes/CN=system:node:{node.name}",
                    "-out", str(request)], check=True, capture_output=True)  # fmt: skip
    subprocess.run(["openssl", "x509", "-req", "-in", str(request), "-CA", str(cluster.pki / "ca.crt"),
                    "-CAkey", str(cluster.pki / "ca.key"), "-set_serial", f"0x{secrets.token_hex(16)}",
                    "-days", str(CERTIFICATE_DAYS), "-extfile", str(usage), "-out", str(cert_file)],
                   check=True, capture_output=True)  # fmt: skip
    return cert_file, key_file


def _start_kubelet(node: RealNode, *, cluster: LocalCluster, kubelet: Path, taints: list[dict[str, str]],
                   sync_frequency_seconds: int | None) -> None:  # fmt: skip
    cert_file, key_file = _node_credentials(node, cluster=cluster)
    kubeconfig: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Config", "current-context": "node",
        "clusters": [{"name": cluster.name, "cluster": {"server": cluster.server,
                                                        "certificate-authority": str(cluster.pki / "ca.crt")}}],
        "users": [{"name": node.name, "user": {"client-certificate": str(cert_file), "client-key": str(key_file)}}],
        "contexts": [{"name": "node", "context": {"cluster": cluster.name, "user": node.name}}],
    }  # fmt: skip
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": node.node_ip, "port": node.kubelet_port,
        "healthzPort": 0, "readOnlyPort": 0,  # no fixed ports: parallel test workers each run a node
        "containerRuntimeEndpoint": f"unix://{node.containerd_socket}",
        # cgroups v1 here: the cgroupfs driver (no systemd), no QoS or node-allocatable cgroups to manage.
        "cgroupDriver": "cgroupfs", "failCgroupV1": False, "cgroupsPerQOS": False, "enforceNodeAllocatable": [],
        "failSwapOn": False, "localStorageCapacityIsolation": False,
        # The API server authenticates with the cluster's admin certificate (clusters.py), checked here.
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(cluster.pki / "ca.crt")}},
        "authorization": {"mode": "Webhook"},
        "resolvConf": "/etc/resolv.conf",
        "registerWithTaints": taints,
        **({"syncFrequency": f"{sync_frequency_seconds}s"} if sync_frequency_seconds else {}),
    }  # fmt: skip
    (node.directory / "kubelet.kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    (node.directory / "kubelet.yaml").write_text(yaml.safe_dump(config))
    # Its root holds pods' volumes, its serving certificate (pki/, self-signed) and its sockets.
    _spawn([str(kubelet), "--config", str(node.directory / "kubelet.yaml"),
            "--kubeconfig", str(node.directory / "kubelet.kubeconfig"), "--root-dir", str(node.directory / "kubelet"),
            "--hostname-override", node.name,
            "--node-ip", node.node_ip, "--v", "2"],
           log=node.directory / "kubelet.log", pid_file=node.directory / "kubelet.pid")  # fmt: skip


def _wait_ready(node: RealNode, *, cluster: LocalCluster) -> None:
    core = k8s.CoreV1Api(cluster.api_client())

    def ready() -> bool:
        # By its pid file, or by its arguments: a kubelet read at the instant of its start was once taken for
        # one that ended, and a second one started beside it (which then failed to bind the first one's port).
        if not _pid(node.directory / "kubelet.pid", node.directory) and not _processes_with_argument(
                str(node.directory / "kubelet.yaml")):  # fmt: skip
            raise KubeletExited(f"the kubelet exited ({_ended(node.directory / 'kubelet.pid')}):\n"
                               f"{_tail(node.directory / 'kubelet.log')}")  # fmt: skip
        try:
            status = core.read_node(node.name).status
        except k8s.ApiException:
            return False
        return any(c.type == "Ready" and c.status == "True" for c in (status.conditions if status else None) or [])

    try:
        wait_for(ready, timeout=READY_TIMEOUT, what=f"node {node.name} to be Ready", interval=0.5)
    except TimeoutError as e:
        raise TimeoutError(f"{e}\n--- kubelet:\n{_tail(node.directory / 'kubelet.log')}\n--- containerd:\n"
                           f"{_tail(node.directory / 'containerd.log')}") from None  # fmt: skip


def stop_real_nodes(workdir: Path, *, cluster: str = "*") -> None:
    """Stops the real nodes started under `workdir` (the clusters' workdir): those of `cluster`, or all (when
    the environment goes)."""
    for directory in sorted((workdir / "realnodes").glob(f"{cluster}/*")):
        stop_real_node(directory)


def stop_real_node(directory: Path) -> None:
    """Ends what the node in `directory` started: the kubelet, then every container (killed, its network
    namespace removed), containerd and its shims, the bridge, and whatever stays mounted under the node's
    directory. Idempotent."""
    kubelet_pid = _pid(directory / "kubelet.pid", directory)
    if kubelet_pid:
        stop_process_group(kubelet_pid, timeout=10)
    for kubelet in _processes_with_argument(str(directory / "kubelet.yaml")):  # one its pid file no longer names
        _kill(kubelet)
    socket = _containerd_socket(directory)
    containerd_pid = _pid(directory / "containerd.pid", directory)
    if containerd_pid:
        _remove_containers(socket)
        stop_process_group(containerd_pid, timeout=10)
    # A shim is a session of its own, started with containerd's address: one left behind is ended by its pid.
    for shim in _processes_with_argument(str(socket)):
        _kill(shim)
    for pid_file in (directory / "kubelet.pid", directory / "containerd.pid"):
        pid_file.unlink(missing_ok=True)
    node_file = directory / "node.json"
    if node_file.exists():
        bridge = json.loads(node_file.read_text())["bridge"]
        _remove_rules(bridge)
        subprocess.run(["ip", "link", "delete", bridge], check=False, capture_output=True)
    _unmount_under(directory)


def _containerd_socket(directory: Path) -> Path:
    return directory / "containerd.sock"


def _ctr(socket: Path, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ctr", "--address", str(socket), "-n", CONTAINERD_NAMESPACE, *args], check=check,
                          capture_output=True, text=True)  # fmt: skip


def _remove_containers(socket: Path) -> None:
    def ctr(*args: str) -> subprocess.CompletedProcess[str]:
        return _ctr(socket, *args)

    netns: set[str] = set()
    for container in ctr("containers", "list", "--quiet").stdout.split():
        info = ctr("containers", "info", container)
        if info.returncode == 0:
            spec = json.loads(info.stdout).get("Spec") or {}
            for namespace in (spec.get("linux") or {}).get("namespaces") or []:
                if namespace.get("type") == "network" and namespace.get("path"):
                    netns.add(namespace["path"])
        ctr("tasks", "kill", "--all", "--signal", "SIGKILL", container)
        for _ in range(50):
            if ctr("tasks", "delete", container).returncode == 0 or "not found" in ctr("tasks", "ps", container).stderr:
                break
            time.sleep(0.1)
        ctr("containers", "delete", container)
    # The CRI plugin's network namespaces (/var/run/netns/cni-...) are bind mounts of their own; the veth
    # ends with its namespace.
    for path in netns:
        subprocess.run(["umount", path], check=False, capture_output=True)
        Path(path).unlink(missing_ok=True)


def _unmount_under(directory: Path) -> None:
    prefix = str(directory.resolve()) + "/"
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", mount], check=False, capture_output=True)


def _processes_with_argument(argument: str) -> list[int]:
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            arguments = proc.joinpath("cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argument.encode() in arguments:
            found.append(int(proc.name))
    return found


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _pid(pid_file: Path, directory: Path) -> int | None:
    """The pid in `pid_file` while that process runs and is the node's (its arguments name the node's
    directory): a pid the system gave to another process since is never signalled."""
    if not pid_file.exists():
        return None
    pid = int(pid_file.read_text())
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    running = stat.rsplit(")", 1)[1].split()[0] != "Z"
    return pid if running and str(directory).encode() in arguments else None


def _tail(log: Path, *, lines: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(no log)"
