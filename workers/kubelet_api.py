"""The kubelet API of a virtual node: what the consumer cluster's API server calls for `kubectl logs`,
`exec`, `attach` and `port-forward` on a pod bound to the node, relayed to the pod's copy in the provider
cluster. The virtual kubelet (workers/virtual_kubelet.py) runs one and publishes its address in the node's
status (InternalIP, daemonEndpoints.kubeletEndpoint.Port).

- Transport: TLS with a serving certificate made at start-up (self-signed; the API server checks it only
  when it runs with --kubelet-certificate-authority), HTTP/1.1 only (no ALPN h2).
- Callers: a client certificate signed by the consumer's client CA (kube-system/extension-apiserver-
  authentication, key client-ca-file, read again every CLIENT_CA_REFRESH_SECONDS) is required; its CN and
  O are then authorized by a SubjectAccessReview on nodes/proxy of this node (get for GET, create for
  POST), as kubelets do. Only pods bound to the node are served; others are 404.
- Many nodes: the pool's syncer (workers/tenant_nodes.py) has one per tenant, for all of that tenant's
  virtual nodes of its super cluster (`serves`; the API server does not say which node it called), and
  serves all of them on one port (KubeletServer: the caller's certificate says whose API it calls). The
  review is then on the node the pod is bound to, or, for a pod bound to none of them, on every node. Its `locate` may raise Elsewhere (a pod the pool moved to another super
  cluster): the caller is told where it runs now.
- Routes: /containerLogs/{ns}/{pod}/{container} (provider pods/log, relayed chunked);
  /exec and /attach/{ns}/{pod}[/{uid}]/{container} (SPDY/3.1 from the API server, kube/spdy.py; a
  WebSocket v5/v4 channel session to the provider's API server); /portForward/{ns}/{pod}[/{uid}] (SPDY
  data/error stream pairs; one provider port-forward WebSocket per forwarded connection).

The node declares no ExtendWebSocketsToKubelet feature: the API server then turns kubectl's WebSockets
into SPDY for us, and SPDY is all this server speaks."""

from __future__ import annotations

import collections
import datetime
import http.server
import ipaddress
import json
import logging
import re
import select
import socket
import socketserver
import ssl
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.utils import CryptographyDeprecationWarning
from cryptography.x509.oid import NameOID
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import portforward as provider_portforward
from kubernetes.stream import stream as provider_stream

from kube import spdy
from kube.clock import utcnow
from models.virtual_kubelet import ORIGIN_UID

log = logging.getLogger(__name__)

CLIENT_CA_NAMESPACE, CLIENT_CA_CONFIGMAP, CLIENT_CA_KEY = "kube-system", "extension-apiserver-authentication", "client-ca-file"
# The consumer's client CA rotates; a new one is trusted within this many seconds.
CLIENT_CA_REFRESH_SECONDS = 60.0
# Connections served at once; one more is closed at once (each session holds two or three threads).
MAX_CONNECTIONS = 64
# Port-forward connections at once within one port-forward session (each holds two threads and a WebSocket).
MAX_FORWARDS_PER_SESSION = 16
# The TLS handshake and the request head must come within this time.
HANDSHAKE_SECONDS = 10.0
# The client must open every stream of an exec or attach within this time (the kubelet's default).
STREAM_CREATION_SECONDS = 30.0
# A connection on which nothing moves for this long is closed (the API server pings every 5 s).
IDLE_SECONDS = 4 * 3600.0
# Provider API calls that are not streams (the logs request's head, pod reads, reviews).
REQUEST_TIMEOUT_SECONDS = 30.0
# The serving certificate's lifetime; the virtual kubelet makes a new one whenever it starts.
SERVING_CERT_DAYS = 365

LOG_QUERY = ("follow", "tailLines", "limitBytes", "timestamps", "sinceSeconds", "sinceTime", "previous")
REMOTE_COMMAND_PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")  # v5 over SPDY is v4 (client-go)
PORT_FORWARD_PROTOCOL = "portforward.k8s.io"
STDIN, STDOUT, STDERR, ERROR, RESIZE = 0, 1, 2, 3, 4  # the provider WebSocket's channels
CHANNEL_OF_STREAM = {"stdout": STDOUT, "stderr": STDERR, "error": ERROR}
STREAM_OF_CHANNEL = {v: k for k, v in CHANNEL_OF_STREAM.items()}

ApiClientSource = k8s.ApiClient | Callable[[], k8s.ApiClient]


class CopyRef(NamedTuple):
    """Where a consumer pod's copy is in the provider."""

    namespace: str
    name: str


# Where to look for a consumer pod's copy, in order (the virtual kubelet knows: its remote namespace, or the
# control namespace while the single-namespace layout's copy is there).
Locate = Callable[[str, str], list[CopyRef]]


class Elsewhere(Exception):
    """A pod whose copy is not in this provider any more; the message says where it runs now."""


class KubeletApi:
    """What one consumer (a virtual kubelet's cluster, or one tenant of a syncer) is served: its callers'
    authorization and the mapping of its pods to their copies. `start()` serves it alone on a port of its
    own (a KubeletServer); a syncer adds many to one KubeletServer instead."""

    def __init__(self, *, host: str, port: int, provider: ApiClientSource, locate: Locate,
                 consumer: k8s.ApiClient, node_name: str, serves: Callable[[str], bool] | None = None,
                 origin_uid: str = ORIGIN_UID) -> None:  # fmt: skip
        """`node_name`: the one node served; with `serves` (which nodes are), only what this API is called in
        logs and messages. `origin_uid`: the annotation of a copy that names the consumer pod's uid."""
        self.host, self.node_name, self.locate, self.origin_uid = host, node_name, locate, origin_uid
        self._serves = serves
        self._provider, self._consumer = provider, consumer
        self._requested_port = port
        self._server: KubeletServer | None = None
        self.client_ca = ClientCa(consumer)

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return self._server.port

    def start(self) -> KubeletApi:
        server = KubeletServer(host=self.host, port=self._requested_port, name=self.node_name)
        server.add(self.node_name, self)
        self._server = server.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def provider(self) -> k8s.ApiClient:
        return self._provider() if callable(self._provider) else self._provider

    # --- authorization and mapping ---

    def serves(self, node: str | None) -> bool:
        return node is not None and (self._serves(node) if self._serves is not None else node == self.node_name)

    def node_of(self, namespace: str, pod: str) -> str:
        """The node a request about a pod is authorized on: this API's one node; of many, the one the pod is
        bound to, or "" (every node) for a pod bound to none of them."""
        if self._serves is None:
            return self.node_name
        bound = self._bound(namespace, pod)
        node = bound.spec.node_name if bound is not None and bound.spec is not None else None
        return node if node is not None and self.serves(node) else ""

    def _bound(self, namespace: str, pod: str) -> k8s.V1Pod | None:
        try:
            return k8s.CoreV1Api(self._consumer).read_namespaced_pod(pod, namespace,
                                                                     _request_timeout=REQUEST_TIMEOUT_SECONDS)  # fmt: skip
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def authorized(self, peer_cert: dict[str, Any], *, verb: str, node: str) -> bool:
        user, groups = _identity(peer_cert)
        attributes = {"verb": verb, "resource": "nodes", "subresource": "proxy", **({"name": node} if node else {})}
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {"user": user, "groups": groups, "resourceAttributes": attributes}}  # fmt: skip
        result = k8s.AuthorizationV1Api(self._consumer).create_subject_access_review(
            k8s.V1SubjectAccessReview.model_validate(review), _request_timeout=REQUEST_TIMEOUT_SECONDS
        )
        return bool(result.status and result.status.allowed)

    def copy_of(self, namespace: str, pod: str, uid: str | None) -> CopyRef | None:
        """Where the provider copy of a consumer pod bound to this node is; None for any other pod, and for a
        copy that is not this pod's. A name is not a pod: the provider may have put another pod under the
        copy's name (a pod it made, one of an earlier pod of the same name; under the single-namespace layout,
        another consumer pod's copy, `a-b`/`c` and `a`/`b-c` sharing one name), so the copy is read and must
        carry this pod's uid (`origin_uid`: ORIGIN_UID, which the virtual kubelet writes at creation)."""
        bound = self._bound(namespace, pod)
        if bound is None or bound.spec is None or not self.serves(bound.spec.node_name) or bound.metadata is None:
            return None
        if uid is not None and bound.metadata.uid != uid:
            return None
        for where in self.locate(namespace, pod):
            try:
                copy = k8s.CoreV1Api(self.provider()).read_namespaced_pod(where.name, where.namespace,
                                                                          _request_timeout=REQUEST_TIMEOUT_SECONDS)  # fmt: skip
            except ApiException as e:
                if e.status in (403, 404):  # not there (nor, 403, its namespace any more)
                    continue
                raise
            origin = ((copy.metadata.annotations if copy.metadata else None) or {}).get(self.origin_uid)
            if origin == bound.metadata.uid:
                return where
            log.warning("kubelet API: the provider's pod %s/%s is not the copy of %s/%s (origin uid %s): refused",
                        where.namespace, where.name, namespace, pod, origin)  # fmt: skip
        return None


def _identity(peer_cert: dict[str, Any]) -> tuple[str, list[str]]:
    """User (CN) and groups (every O) of a certificate as ssl.getpeercert() gives it."""
    user, groups = "", []
    for rdn in peer_cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                user = value
            elif key == "organizationName":
                groups.append(value)
    return user, groups


class ClientCa:
    """A consumer's client CA (the certificates its API server's kubelet client certificate is issued by).
    `refresh` reads it (it rotates); the handshakes use what was last read, never waiting on an API server."""

    def __init__(self, consumer: k8s.ApiClient) -> None:
        self._consumer = consumer
        self._lock = threading.Lock()  # never held during a call to the API server
        self._pem: str | None = None
        self._certificates: list[x509.Certificate] = []

    def refresh(self) -> str:
        """Reads the CA bundle; raises if it was never read, keeps the last one if a later read fails."""
        try:
            configmap = k8s.CoreV1Api(self._consumer).read_namespaced_config_map(
                CLIENT_CA_CONFIGMAP, CLIENT_CA_NAMESPACE, _request_timeout=REQUEST_TIMEOUT_SECONDS
            )
            pem = (configmap.data or {})[CLIENT_CA_KEY]
        except Exception:
            with self._lock:
                if self._pem is None:
                    raise
                log.warning("consumer client CA not re-read; the last one stays trusted", exc_info=True)
                return self._pem
        certificates = _authorities(pem) if pem != self.last() else None
        with self._lock:
            if certificates is not None:
                self._certificates = certificates
            self._pem = pem
            return pem

    def last(self) -> str | None:
        with self._lock:
            return self._pem

    def issued(self, certificate: x509.Certificate) -> bool:
        """Whether one of the CA's certificates signed `certificate` (its issuer, by name and signature)."""
        with self._lock:
            authorities = list(self._certificates)
        for authority in authorities:
            try:
                certificate.verify_directly_issued_by(authority)
                return True
            except (ValueError, TypeError, InvalidSignature):
                continue
        return False


def _authorities(bundle: str) -> list[x509.Certificate]:
    """The certificates of a PEM bundle that parse; one that does not is left out (the TLS handshake, which
    OpenSSL does, still trusts it), and said. kwokctl's CAs have serial number 0, which RFC 5280 forbids and
    cryptography reads with a deprecation warning only."""
    found = []
    for block in re.findall(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", bundle, re.DOTALL):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", CryptographyDeprecationWarning)
                found.append(x509.load_pem_x509_certificate(block.encode()))
        except ValueError as e:
            log.warning("a certificate of a client CA bundle does not parse (%s): callers it issued cannot be told "
                        "apart from another consumer's", e)  # fmt: skip
    return found


class KubeletServer:
    """One listening port for the kubelet APIs of one or many consumers. The TLS handshake trusts every
    consumer's client CA; the caller's certificate then says whose API it calls: the one consumer whose CA
    issued it. A certificate two consumers' CAs both issued (one copied another's CA into its own bundle)
    is refused: serving it as either could relay one tenant's `exec` into another's pod. The client CAs are
    read again every CLIENT_CA_REFRESH_SECONDS by a thread of the server, so that a consumer whose API server
    is slow or gone never holds up another's handshakes."""

    def __init__(self, *, host: str, port: int, name: str) -> None:
        self.host, self.name = host, name
        self._requested_port = port
        self._apis: dict[str, KubeletApi] = {}
        self._lock = threading.Lock()
        self._cert_pem, self._key_pem = _self_signed(host)
        self._context: tuple[tuple[str, ...], ssl.SSLContext] | None = None
        self._server: _Server | None = None
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.server_address[1])

    def start(self) -> KubeletServer:
        self._server = _Server((self.host, self._requested_port), self)
        self._stopping.clear()
        self._threads = [threading.Thread(target=self._server.serve_forever, name=f"kubelet-api-{self.name}", daemon=True),
                         threading.Thread(target=self._refresh_loop, name=f"kubelet-api-ca-{self.name}", daemon=True)]  # fmt: skip
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._server.close_connections()
        for thread in self._threads:
            thread.join(timeout=10)
        self._server = None

    def add(self, key: str, api: KubeletApi) -> None:
        """Serves `api` from now on; raises if its consumer's client CA cannot be read (nothing is served
        for it then: no caller of it could be told apart)."""
        api.client_ca.refresh()
        with self._lock:
            self._apis[key] = api

    def remove(self, key: str, api: KubeletApi) -> None:
        """Serves `api` as `key` no more (nothing if another KubeletApi serves `key` now), and cuts the
        sessions open on it."""
        with self._lock:
            if self._apis.get(key) is not api:
                return
            del self._apis[key]
        if self._server is not None:
            self._server.close_connections(api)

    def serves(self, api: KubeletApi) -> bool:
        with self._lock:
            return any(served is api for served in self._apis.values())

    def tls_context(self) -> tuple[ssl.SSLContext, tuple[KubeletApi, ...]]:
        """The context for a handshake, and the APIs whose CAs it trusts (what was last read of each)."""
        with self._lock:
            apis = tuple(self._apis.values())
            bundles = tuple(sorted({pem for api in apis if (pem := api.client_ca.last()) is not None}))
            if self._context is None or self._context[0] != bundles:
                self._context = (bundles, self._make(bundles))
            return self._context[1], apis

    def api_of(self, tls: ssl.SSLSocket, trusted: tuple[KubeletApi, ...]) -> KubeletApi | None:
        """Whose kubelet API the connection calls, of the APIs `trusted` by its handshake that are still
        served; None for a certificate no single one's CA issued."""
        candidates = [api for api in trusted if self.serves(api)]
        if len(trusted) == 1:  # the handshake trusted its CA alone: a virtual kubelet's one consumer
            return candidates[0] if candidates else None
        der = tls.getpeercert(binary_form=True)
        try:
            certificate = x509.load_der_x509_certificate(der) if der is not None else None
        except ValueError:
            certificate = None
        if certificate is None:
            return None
        issuers = [api for api in candidates if api.client_ca.issued(certificate)]
        if len(issuers) > 1:
            log.warning("kubelet API: a client certificate (%s) was issued by the client CAs of %s: refused",
                        certificate.subject.rfc4514_string(), ", ".join(sorted(api.node_name for api in issuers)))  # fmt: skip
        return issuers[0] if len(issuers) == 1 else None

    def _refresh_loop(self) -> None:
        while not self._stopping.wait(CLIENT_CA_REFRESH_SECONDS):
            with self._lock:
                apis = list(self._apis.values())
            for api in apis:
                try:
                    api.client_ca.refresh()
                except Exception as e:  # noqa: BLE001 - never read is impossible here (add read it): logged, kept
                    log.warning("kubelet API %s: client CA not re-read: %s", api.node_name, e)

    def _make(self, bundles: tuple[str, ...]) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED
        for pem in bundles:
            context.load_verify_locations(cadata=pem)
        context.set_alpn_protocols(["http/1.1"])  # never h2: the SPDY upgrade needs HTTP/1.1
        # load_cert_chain reads files only: a private directory that lives just as long as the call.
        with tempfile.TemporaryDirectory(prefix="kubelet-api-") as directory:
            cert, key = Path(directory) / "tls.crt", Path(directory) / "tls.key"
            cert.write_bytes(self._cert_pem)
            key.touch(mode=0o600)
            key.write_bytes(self._key_pem)
            context.load_cert_chain(cert, key)
        return context


def _self_signed(host: str) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"tidepool-virtual-kubelet@{host}")])
    try:
        san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        san = x509.DNSName(host)
    now = utcnow()
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=SERVING_CERT_DAYS))
        .add_extension(x509.SubjectAlternativeName([san]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())  # fmt: skip
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], owner: KubeletServer) -> None:
        self.owner = owner
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._open: dict[socket.socket, KubeletApi] = {}
        self._open_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            log.warning("kubelet API: %d connections already, one refused", MAX_CONNECTIONS)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The TLS handshake runs here, in the connection's thread: a slow client never holds up accept().
        request.settimeout(HANDSHAKE_SECONDS)
        try:
            context, trusted = self.owner.tls_context()
            tls = context.wrap_socket(request, server_side=True)
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError) as e:  # closed before a handshake: a TCP probe, its kubelet's
            log.debug("kubelet API: connection from %s closed before its handshake: %s", client_address[0], e)
            return
        except (OSError, ssl.SSLError) as e:
            log.info("kubelet API: TLS handshake from %s failed: %s", client_address[0], e)
            return
        api = self.owner.api_of(tls, trusted)
        if api is None:
            log.info("kubelet API: a certificate from %s no one consumer's client CA issued: closed", client_address[0])
            _close_quietly(tls)
            return
        with self._open_lock:
            self._open[tls] = api
        try:
            if not self.owner.serves(api):  # removed meanwhile, after close_connections looked
                return
            _Handler(tls, client_address, self)
        finally:
            with self._open_lock:
                self._open.pop(tls, None)
            _close_quietly(tls)

    def api_of(self, connection: socket.socket) -> KubeletApi:
        with self._open_lock:
            return self._open[connection]

    def close_connections(self, api: KubeletApi | None = None) -> None:
        """Every open connection, or those of `api`."""
        with self._open_lock:
            for connection, served in list(self._open.items()):
                if api is None or served is api:
                    _shutdown_quietly(connection)


def _close_quietly(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


def _shutdown_quietly(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


@dataclass(frozen=True)
class _Route:
    kind: str  # containerLogs, exec, attach, portForward
    namespace: str
    pod: str
    uid: str | None
    container: str | None


def _route(path: str) -> _Route | None:
    parts = [p for p in path.split("/") if p]
    if not parts:
        return None
    kind, rest = parts[0], parts[1:]
    if kind == "containerLogs" and len(rest) == 3:
        return _Route(kind, rest[0], rest[1], None, rest[2])
    if kind in ("exec", "attach") and len(rest) in (3, 4):
        return _Route(kind, rest[0], rest[1], rest[2] if len(rest) == 4 else None, rest[-1])
    if kind == "portForward" and len(rest) in (2, 3):
        return _Route(kind, rest[0], rest[1], rest[2] if len(rest) == 3 else None, None)
    return None


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Unbuffered: the request head is read byte by byte, so no byte of the SPDY session after an upgrade
    # can be left behind in a reader's buffer.
    rbufsize = 0
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        self._serve("get")

    def do_POST(self) -> None:  # noqa: N802
        self._serve("create")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        log.debug("kubelet API %s: " + format, self.client_address[0], *args)

    def _serve(self, verb: str) -> None:
        self.close_connection = True  # one request per connection: streams take the socket over
        api = self.server.api_of(self.connection)
        url = urlsplit(self.path)
        route = _route(url.path)
        methods = ("get",) if route is not None and route.kind == "containerLogs" else ("get", "create")
        if route is None or verb not in methods:
            return self._status(404, "NotFound", f"no such kubelet API path: {url.path}")
        try:
            node = api.node_of(route.namespace, route.pod)
            if not api.authorized(self.connection.getpeercert() or {}, verb=verb, node=node):
                return self._status(403, "Forbidden", f"forbidden: nodes/proxy {verb} on node {node or api.node_name}")
            copy = api.copy_of(route.namespace, route.pod, route.uid)
        except Elsewhere as e:
            return self._status(404, "NotFound", str(e))
        except ApiException as e:
            log.warning("kubelet API: consumer or provider call failed: %s", e.status)
            return self._status(503, "ServiceUnavailable", "the consumer's or the provider's API server did not answer")
        if copy is None:
            return self._status(404, "NotFound", f"pod {route.namespace}/{route.pod} is not on node {api.node_name}, "
                                                 "or its copy in the provider is not this pod's")  # fmt: skip
        query = parse_qs(url.query)
        self.connection.settimeout(None)
        if route.kind == "containerLogs":
            assert route.container is not None
            _relay_logs(self, api, copy=copy, container=route.container, query=query)
        elif route.kind == "portForward":
            _PortForwardSession(self, api, copy=copy).serve()
        else:
            assert route.container is not None
            _RemoteCommandSession(self, api, kind=route.kind, copy=copy, container=route.container, query=query).serve()

    def _status(self, code: int, reason: str, message: str) -> None:
        body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                           "reason": reason, "code": code}).encode()  # fmt: skip
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


# --- logs ---


def _relay_logs(handler: _Handler, api: KubeletApi, *, copy: CopyRef, container: str,
                query: dict[str, list[str]]) -> None:  # fmt: skip
    provider = api.provider()
    params = [("container", container)] + [(k, query[k][0]) for k in LOG_QUERY if k in query]
    method, url, headers, _, _ = provider.param_serialize(
        "GET", "/api/v1/namespaces/{namespace}/pods/{name}/log",
        path_params={"namespace": copy.namespace, "name": copy.name}, query_params=params,
        auth_settings=["BearerToken"],
    )  # fmt: skip
    try:
        upstream = provider.call_api(method, url, header_params=headers,
                                     _request_timeout=(REQUEST_TIMEOUT_SECONDS, IDLE_SECONDS)).response  # fmt: skip
    except Exception as e:  # noqa: BLE001 - the provider unreachable is the caller's 502, not a crash
        log.warning("kubelet API: provider logs request failed: %s", type(e).__name__)
        return handler._status(502, "BadGateway", "the provider cluster did not answer")
    try:
        if upstream.status != 200:  # the provider's Status (a missing container, a pod not started) as it is
            body = upstream.read()
            handler.send_response(upstream.status)
            handler.send_header("Content-Type", upstream.headers.get("Content-Type", "application/json"))
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
            return
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        # A following reader gets nothing while the pod writes nothing: a watcher notices the caller
        # leaving (the only thing it may send now is a close) and cuts the provider stream.
        done = threading.Event()
        watcher = threading.Thread(target=_cut_when_gone, args=(handler.connection, upstream, done), daemon=True,
                                   name="kubelet-api-logs-watch")  # fmt: skip
        watcher.start()
        try:
            for chunk in upstream.stream(32 * 1024, decode_content=True):
                if chunk:
                    handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    handler.wfile.flush()
            handler.wfile.write(b"0\r\n\r\n")
        except Exception as e:  # noqa: BLE001 - either side gone: the relay ends
            log.debug("kubelet API: log relay ended: %s", type(e).__name__)
        finally:
            done.set()
            watcher.join(timeout=5)
    finally:
        upstream.release_conn()


def _cut_when_gone(client: socket.socket, upstream: Any, done: threading.Event) -> None:
    while not done.is_set():
        readable, _, _ = select.select([client], [], [], 1.0)
        if readable and not done.is_set():
            upstream.shutdown()  # wakes the relay's blocked read
            return


# --- SPDY sessions ---


class _SpdyConnection:
    """One upgraded connection. The socket is non-blocking so that the reading thread and the writing
    threads take turns on the TLS connection under one lock, never holding it while they wait."""

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self._encoder = spdy.FrameEncoder()
        self._decoder = spdy.FrameDecoder()
        self._pending: collections.deque[spdy.Frame] = collections.deque()  # decoded, not yet taken
        self._last_read = time.monotonic()
        self.closed = threading.Event()
        sock.setblocking(False)

    def send(self, frame: spdy.Frame) -> None:
        with self._lock:
            if self.closed.is_set():
                raise ConnectionError("connection closed")
            view = memoryview(self._encoder.encode(frame))
            while view:
                try:
                    sent = self._sock.send(view)
                    view = view[sent:]
                except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                    if not select.select([], [self._sock], [], IDLE_SECONDS)[1]:
                        raise TimeoutError("peer does not read") from None

    def send_data(self, stream_id: int, data: bytes, *, fin: bool = False) -> None:
        for offset in range(0, len(data), spdy.MAX_DATA):
            self.send(spdy.Data(stream_id, data[offset : offset + spdy.MAX_DATA]))
        if fin:
            self.send(spdy.Data(stream_id, b"", fin=True))

    def frames(self, *, deadline: float | None = None) -> Iterator[spdy.Frame]:
        """Frames as they come, until the peer closes, the connection is idle for IDLE_SECONDS, or
        `deadline` (a time.monotonic()) passes. Frames not taken stay for the next call."""
        while not self.closed.is_set():
            if self._pending:
                yield self._pending.popleft()
                continue
            with self._lock:
                try:
                    data: bytes | None = self._sock.recv(64 * 1024)
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                    data = None
                except OSError:
                    data = b""
            if data is None:
                remaining = (deadline or self._last_read + IDLE_SECONDS) - time.monotonic()
                if remaining <= 0:
                    return
                # At most a second at a time, so that a close() from another thread is seen.
                select.select([self._sock], [], [], min(remaining, 1.0))
                continue
            if not data:
                return
            self._last_read = time.monotonic()
            try:
                self._pending.extend(self._decoder.feed(data))
            except spdy.ProtocolError as e:
                log.info("kubelet API: SPDY protocol error: %s", e)
                return

    def close(self) -> None:
        if self.closed.is_set():
            return
        try:
            self.send(spdy.GoAway(last_stream_id=0))
        except (OSError, ConnectionError):
            pass
        self.closed.set()
        with self._lock:
            _shutdown_quietly(self._sock)


def _negotiate(handler: _Handler, supported: tuple[str, ...]) -> str | None:
    """The SPDY/3.1 upgrade handshake: the first protocol version the client offers that we speak."""
    if (handler.headers.get("Upgrade") or "").lower() != "spdy/3.1":
        handler._status(400, "BadRequest", "this kubelet API streams over SPDY/3.1 only")
        return None
    offered = [p.strip() for v in handler.headers.get_all("X-Stream-Protocol-Version") or [] for p in v.split(",")]
    chosen = next((p for p in offered if p in supported), None)
    if chosen is None:
        handler.send_response(403)
        handler.send_header("X-Accepted-Stream-Protocol-Versions", ", ".join(supported))
        handler.send_header("Content-Length", "0")
        handler.end_headers()
        return None
    handler.send_response(101)
    handler.send_header("Connection", "Upgrade")
    handler.send_header("Upgrade", "SPDY/3.1")
    handler.send_header("X-Stream-Protocol-Version", chosen)
    handler.end_headers()
    handler.wfile.flush()
    return chosen


def _flag(query: dict[str, list[str]], name: str) -> bool:
    return (query.get(name) or ["0"])[0].lower() in ("1", "true")


def _session_client(api: KubeletApi) -> k8s.ApiClient:
    # kubernetes.stream swaps call_api on the client it is given for the call's length: a client of the
    # session's own keeps the provider client other threads use out of that.
    return k8s.ApiClient(api.provider().configuration)


def _status_json(message: str) -> bytes:
    return json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": message, "reason": "InternalError", "code": 500}).encode()  # fmt: skip


class _RemoteCommandSession:
    """exec and attach: the streams kubectl asked for (by the API server) on one side, a WebSocket channel
    session with the provider's API server on the other."""

    def __init__(self, handler: _Handler, api: KubeletApi, *, kind: str, copy: CopyRef, container: str,
                 query: dict[str, list[str]]) -> None:  # fmt: skip
        self.handler, self.api, self.kind, self.copy, self.container = handler, api, kind, copy, container
        self.stdin, self.stdout, self.tty = _flag(query, "input"), _flag(query, "output"), _flag(query, "tty")
        self.stderr = _flag(query, "error") and not self.tty  # a terminal merges stderr into stdout
        self.command = query.get("command", [])
        self.streams: dict[str, int] = {}

    def serve(self) -> None:
        if _negotiate(self.handler, REMOTE_COMMAND_PROTOCOLS) is None:
            return
        connection = _SpdyConnection(self.handler.connection)
        try:
            expected = {"error"} | {n for n, on in (("stdin", self.stdin), ("stdout", self.stdout),
                                                    ("stderr", self.stderr), ("resize", self.tty)) if on}  # fmt: skip
            frames = connection.frames(deadline=time.monotonic() + STREAM_CREATION_SECONDS)
            for frame in frames:
                self._control(connection, frame)
                if expected <= self.streams.keys():
                    break
            else:
                return  # the client left, or did not open its streams in time
            try:
                remote = self._open_remote()
            except Exception as e:  # noqa: BLE001 - told to the client on its error stream
                log.info("kubelet API: provider %s failed: %s", self.kind, type(e).__name__)
                connection.send_data(self.streams["error"], _status_json(f"provider {self.kind} failed: {e}"), fin=True)
                return
            pump = threading.Thread(target=self._pump_remote, args=(remote, connection), daemon=True,
                                    name=f"kubelet-api-{self.kind}")  # fmt: skip
            pump.start()
            try:
                self._pump_client(connection, remote)
            finally:
                remote.close()
                pump.join(timeout=10)
        finally:
            connection.close()

    def _control(self, connection: _SpdyConnection, frame: spdy.Frame) -> None:
        if isinstance(frame, spdy.SynStream):
            kind = spdy.header(frame.headers, "streamtype") or ""
            self.streams[kind] = frame.stream_id
            connection.send(spdy.SynReply(frame.stream_id))
        elif isinstance(frame, spdy.Ping):
            connection.send(frame)

    def _open_remote(self) -> Any:
        core = k8s.CoreV1Api(_session_client(self.api))
        call = core.connect_get_namespaced_pod_exec if self.kind == "exec" else core.connect_get_namespaced_pod_attach
        options: dict[str, Any] = {"container": self.container, "stdin": self.stdin, "stdout": self.stdout,
                                   "stderr": self.stderr, "tty": self.tty}  # fmt: skip
        if self.kind == "exec":
            options["command"] = self.command
        return provider_stream(call, self.copy.name, self.copy.namespace, **options, binary=True,
                               _preload_content=False)  # fmt: skip

    def _pump_client(self, connection: _SpdyConnection, remote: Any) -> None:
        stdin, resize = self.streams.get("stdin"), self.streams.get("resize")
        sizes = ""
        for frame in connection.frames():
            if isinstance(frame, spdy.Data) and frame.stream_id == stdin:
                if frame.data:
                    remote.write_channel(STDIN, frame.data)
                if frame.fin:
                    remote.close_channel(STDIN)  # v5 only; v4 has no way to say end of input
            elif isinstance(frame, spdy.Data) and frame.stream_id == resize:
                sizes += frame.data.decode(errors="replace")
                while sizes:  # a JSON stream of {"Width": w, "Height": h}; the provider takes one per message
                    try:
                        size, end = json.JSONDecoder().raw_decode(sizes)
                    except ValueError:
                        break  # the rest of the object is still on its way
                    remote.write_channel(RESIZE, json.dumps(size).encode())
                    sizes = sizes[end:].lstrip()
            elif isinstance(frame, spdy.Ping):
                connection.send(frame)
            elif isinstance(frame, spdy.GoAway | spdy.RstStream):
                return

    def _pump_remote(self, remote: Any, connection: _SpdyConnection) -> None:
        """Provider channels to the client's streams; when the provider ends, the streams end."""
        try:
            while True:
                opcode, frame = remote.sock.recv_data_frame(False)  # answers pings itself
                if opcode not in (1, 2):  # text, binary; the only other one returned is the close
                    break
                data = frame.data if isinstance(frame.data, bytes) else frame.data.encode()
                name = STREAM_OF_CHANNEL.get(data[0]) if data else None
                stream_id = self.streams.get(name) if name else None
                if stream_id is not None and len(data) > 1:
                    connection.send_data(stream_id, data[1:])
        except Exception as e:  # noqa: BLE001 - the provider's close, or the client's (remote.close())
            log.debug("kubelet API: provider stream ended: %s", type(e).__name__)
        try:
            for name in ("stdout", "stderr", "error"):
                if name in self.streams:
                    connection.send_data(self.streams[name], b"", fin=True)
        except (OSError, ConnectionError):
            pass
        connection.close()


class _PortForwardSession:
    """port-forward: each forwarded connection is a pair of streams (data, error) sharing a requestid; each
    gets a provider port-forward WebSocket of its own."""

    def __init__(self, handler: _Handler, api: KubeletApi, *, copy: CopyRef) -> None:
        self.handler, self.api, self.copy = handler, api, copy
        self.pairs: dict[str, dict[str, int]] = {}
        self.forwards: dict[int, _Forward] = {}  # by data stream id
        self.lock = threading.Lock()

    def serve(self) -> None:
        if _negotiate(self.handler, (PORT_FORWARD_PROTOCOL,)) is None:
            return
        connection = _SpdyConnection(self.handler.connection)
        try:
            for frame in connection.frames():
                if isinstance(frame, spdy.SynStream):
                    self._open(connection, frame)
                elif isinstance(frame, spdy.Data):
                    forward = self.forwards.get(frame.stream_id)
                    if forward is not None and frame.data:
                        # A FIN (the client's half-close) is not passed on: the provider's port-forward
                        # client ends the whole connection when its local side closes.
                        forward.to_pod(frame.data)
                elif isinstance(frame, spdy.RstStream):
                    forward = self.forwards.get(frame.stream_id)
                    if forward is not None:
                        forward.close()
                elif isinstance(frame, spdy.Ping):
                    connection.send(frame)
                elif isinstance(frame, spdy.GoAway):
                    break
        finally:
            connection.close()
            for forward in list(self.forwards.values()):
                forward.close()
            for forward in list(self.forwards.values()):
                forward.join(timeout=10)

    def _open(self, connection: _SpdyConnection, frame: spdy.SynStream) -> None:
        kind = spdy.header(frame.headers, "streamtype")
        request, port = spdy.header(frame.headers, "requestid") or "", spdy.header(frame.headers, "port") or ""
        live = sum(1 for f in self.forwards.values() if f.is_alive())
        if kind not in ("data", "error") or not port.isdigit() or live >= MAX_FORWARDS_PER_SESSION:
            connection.send(spdy.RstStream(frame.stream_id, spdy.RST_REFUSED_STREAM))
            return
        connection.send(spdy.SynReply(frame.stream_id))
        pair = self.pairs.setdefault(request, {})
        pair[kind] = frame.stream_id
        if len(pair) == 2:
            del self.pairs[request]
            forward = _Forward(self.api, copy=self.copy, port=int(port), connection=connection,
                               data_stream=pair["data"], error_stream=pair["error"])  # fmt: skip
            self.forwards[pair["data"]] = forward
            forward.start()


class _Forward(threading.Thread):
    """One forwarded connection: a provider port-forward WebSocket for one port, pumped both ways."""

    def __init__(self, api: KubeletApi, *, copy: CopyRef, port: int, connection: _SpdyConnection, data_stream: int,
                 error_stream: int) -> None:  # fmt: skip
        super().__init__(daemon=True, name=f"kubelet-api-forward-{port}")
        self.api, self.copy, self.port, self.connection = api, copy, port, connection
        self.data_stream, self.error_stream = data_stream, error_stream
        self._opened = threading.Event()
        self._closed = threading.Event()
        self._remote: Any = None
        self._pod_side: socket.socket | None = None

    def run(self) -> None:
        error = b""
        try:
            core = k8s.CoreV1Api(_session_client(self.api))
            self._remote = provider_portforward(core.connect_get_namespaced_pod_portforward, self.copy.name,
                                                self.copy.namespace, ports=str(self.port))  # fmt: skip
            self._pod_side = self._remote.socket(self.port)
            self._pod_side.settimeout(None)
            self._opened.set()
            while not self._closed.is_set():
                data = self._pod_side.recv(spdy.MAX_DATA)
                if not data:
                    break
                self.connection.send(spdy.Data(self.data_stream, data))
            error = (self._remote.error(self.port) or "").encode()
        except Exception as e:  # noqa: BLE001 - the client hears of it on the error stream
            if not self._closed.is_set():
                error = f"provider port-forward to port {self.port} failed: {type(e).__name__}".encode()
        finally:
            self._opened.set()
            try:
                if error:
                    self.connection.send(spdy.Data(self.error_stream, error))
                self.connection.send(spdy.Data(self.error_stream, b"", fin=True))
                self.connection.send(spdy.Data(self.data_stream, b"", fin=True))
            except (OSError, ConnectionError):
                pass
            self._teardown()

    def to_pod(self, data: bytes) -> None:
        # Called by the reading thread: the first bytes may come before the provider side is open.
        self._opened.wait(REQUEST_TIMEOUT_SECONDS)
        pod_side = self._pod_side
        if pod_side is None or self._closed.is_set():
            return
        try:
            pod_side.sendall(data)
        except OSError:
            self.close()

    def close(self) -> None:
        self._closed.set()
        if self._pod_side is not None:
            _shutdown_quietly(self._pod_side)

    def _teardown(self) -> None:
        self._closed.set()
        if self._pod_side is not None:
            _close_quietly(self._pod_side)
        if self._remote is not None:
            try:
                self._remote.close()
            except Exception:  # noqa: BLE001 - closing what may be closed
                pass

