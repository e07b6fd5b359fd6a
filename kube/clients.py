"""Clients and the credentials they carry: from a kubeconfig file (followed as it is renewed), from a
kubeconfig Secret's content (cached by the Secret's resourceVersion), or the in-cluster service account.

Two kinds of kubeconfig, one way each to read them: this cluster's operator's own (`own`: the
Kubernetes client's full loader, exec plugins and files included, as kubectl) and those another party
wrote (`peer`: models/kubeconfig.py reduces them to server, CA and token, and the client is built from
those alone; nothing else in them is ever loaded)."""

from __future__ import annotations

import atexit
import base64
import contextlib
import hashlib
import logging
import os
import queue
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping
from time import monotonic
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client import rest
from kubernetes.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError

from kube.errors import INVALID_CREDENTIALS, MISSING_CREDENTIALS
from models.kubeconfig import MAX_KUBECONFIG_BYTES, InvalidKubeconfig, PeerCredentials, peer_credentials

# Connections a client keeps open to its API server. The client's default is 5 per core (10 here), but a
# worker runs 32 activity threads and 16 push reads (its watches go through kube/streams.py): with 10,
# most requests opened a TLS connection and threw it away ("Connection pool is full"), paying a handshake
# each. An idle connection costs a socket; a fresh one costs milliseconds of CPU.
CONNECTIONS_PER_CLIENT = 64


def client_from_own_kubeconfig_file(path: str | None) -> k8s.ApiClient:
    """A client for this cluster's operator's own kubeconfig (a worker's --kubeconfig, the CLI's files, a
    syncer's super cluster), with the Kubernetes client's full loader, following the file as it is
    renewed; None means the in-cluster service account (whose loader already re-reads its projected token).
    Never for a kubeconfig another party wrote: that is `client_from_peer_kubeconfig_file`."""
    if path is None:
        configuration = k8s.Configuration(connection_pool_maxsize=CONNECTIONS_PER_CLIENT)
        k8s_config.load_incluster_config(client_configuration=configuration)
        return k8s.ApiClient(configuration)
    return OwnKubeconfigFileClient(path)


def client_from_peer_kubeconfig_file(path: str) -> PeerKubeconfigFileClient:
    """A client for a kubeconfig file another party wrote (the provider's, mounted into a virtual kubelet):
    parsed into server, CA and token (models/kubeconfig.py), following the file as it is renewed."""
    return PeerKubeconfigFileClient(path)


def client_from_peer_kubeconfig_text(text: str | bytes) -> k8s.ApiClient:
    """A client for a kubeconfig another party wrote (or `tidepool peer`): only its server, CA and token are
    used; InvalidKubeconfig names the field when anything else is there."""
    return k8s.ApiClient(peer_configuration(parse_peer_kubeconfig(text)))


def parse_peer_kubeconfig(text: str | bytes) -> PeerCredentials:
    """The text bounded, loaded as plain YAML (no anchors, aliases or tags: nothing expands), then reduced
    by models.kubeconfig."""
    raw = text.encode() if isinstance(text, str) else text
    if len(raw) > MAX_KUBECONFIG_BYTES:
        raise InvalidKubeconfig("kubeconfig", f"larger than {MAX_KUBECONFIG_BYTES} bytes")
    try:
        decoded = raw.decode("utf-8")
        for event in yaml.parse(decoded, Loader=yaml.CSafeLoader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
                raise InvalidKubeconfig("kubeconfig", "YAML anchors and aliases are not accepted")
            if getattr(event, "tag", None) is not None:  # an explicit tag: a type of the reader's to build
                raise InvalidKubeconfig("kubeconfig", "YAML tags are not accepted")
        # libyaml's parser: the pure-Python one took a tenth of a worker's CPU when a thousand peerings started.
        document = yaml.load(decoded, Loader=yaml.CSafeLoader)
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        mark = getattr(e, "problem_mark", None)  # the position only: the text may hold a token
        raise InvalidKubeconfig("kubeconfig", "not YAML" + (f" (line {mark.line + 1})" if mark else "")) from None
    return peer_credentials(document)


def peer_configuration(credentials: PeerCredentials) -> k8s.Configuration:
    """A client configuration from the parsed fields alone: TLS verified against the given CA, the token
    as a bearer header, no proxy, no client certificate."""
    configuration = k8s.Configuration(host=credentials.server, connection_pool_maxsize=CONNECTIONS_PER_CLIENT)
    configuration.ssl_ca_cert = _ca_file(credentials.certificate_authority)
    configuration.verify_ssl = True
    configuration.api_key["BearerToken"] = f"Bearer {credentials.token}"
    return configuration


_ca_dir: str | None = None
_ca_lock = threading.Lock()


def _ca_file(pem: bytes) -> str:
    """A file holding `pem` (TLS libraries and the WebSocket client take a CA by path): one per content, in
    a directory of this process's own (mode 0700), so that a rotation that keeps its CA writes nothing."""
    global _ca_dir
    with _ca_lock:
        if _ca_dir is None:
            _ca_dir = tempfile.mkdtemp(prefix="tidepool-ca-")
            atexit.register(shutil.rmtree, _ca_dir, ignore_errors=True)  # else every process leaves one in /tmp
        path = os.path.join(_ca_dir, hashlib.sha256(pem).hexdigest() + ".crt")
        if not os.path.exists(path):
            os.makedirs(_ca_dir, mode=0o700, exist_ok=True)  # a /tmp cleaner may have taken it
            with open(path + ".tmp", "wb") as f:
                f.write(pem)
            os.replace(path + ".tmp", path)
        return path


class _FollowedKubeconfigClient(k8s.ApiClient):
    """An API client that follows its kubeconfig file: credentials that are renewed in place (a mounted
    Secret, which the kubelet swaps atomically) are used from the next request on, without a restart.

    Before each request a stat of the file (cheap) tells whether it changed; a changed file is loaded
    again. A 401 makes it read the file once more and, if that gives other credentials, send the same
    request again: a holder whose token was just rotated never shows the refusal to its callers. A 401
    that survives the re-read is the caller's to see. Watches go through the same path when they start.
    A file that cannot be loaded leaves the credentials the client has."""

    def __init__(self, path: str, configuration: k8s.Configuration) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._stamp = _file_stamp(path)
        super().__init__(configuration)

    def _load(self) -> k8s.Configuration:
        raise NotImplementedError

    def _refused(self, error: Exception) -> None:
        logging.getLogger(__name__).warning("kubeconfig %s not reloaded: %s", self._path, type(error).__name__)

    def follow(self) -> None:
        """Load the file again if it changed (a stat tells)."""
        stamp = _file_stamp(self._path)
        if stamp is not None and stamp != self._stamp:
            self.reload()

    def param_serialize(self, *args: Any, **kwargs: Any) -> Any:
        # Called for every request before its auth header is computed: the place to pick up a new file.
        self.follow()
        return super().param_serialize(*args, **kwargs)

    def call_api(self, method: str, url: str, header_params: dict[str, str] | None = None, body: Any = None,
                 post_params: Any = None, _request_timeout: Any = None) -> rest.RESTResponse:  # fmt: skip
        response = super().call_api(method, url, header_params, body, post_params, _request_timeout)
        if response.status != 401:
            return response
        sent_host, sent_auth = self.configuration.host, (header_params or {}).get("authorization")
        self.reload()
        headers = {k: v for k, v in (header_params or {}).items() if k != "authorization"}
        auth = self.configuration.auth_settings().get("BearerToken")
        if auth:
            headers["authorization"] = auth["value"]
        if headers.get("authorization") == sent_auth and self.configuration.host == sent_host:
            return response  # the same credentials again: the refusal stands
        response.read()  # release the refused response's connection
        if url.startswith(sent_host):
            url = self.configuration.host + url[len(sent_host):]
        return super().call_api(method, url, headers, body, post_params, _request_timeout)

    def reload(self) -> None:
        """Read the file again and use what it says from now on (a new connection pool too: the server's
        address or certificates may have changed with the credentials)."""
        with self._lock:
            stamp = _file_stamp(self._path)
            try:
                configuration = self._load()
            except Exception as e:  # noqa: BLE001 - a file caught mid-write, gone or refused: keep what works
                if isinstance(e, InvalidKubeconfig):
                    self._stamp = stamp  # refused: said once per version of the file, not at every request
                self._refused(e)
                return
            self.configuration = configuration
            self.rest_client = rest.RESTClientObject(configuration)
            self._stamp = stamp


class OwnKubeconfigFileClient(_FollowedKubeconfigClient):
    """This cluster's operator's kubeconfig file, with the Kubernetes client's full loader."""

    def __init__(self, path: str) -> None:
        super().__init__(path, self._configuration(path))

    def _load(self) -> k8s.Configuration:
        return self._configuration(self._path)

    @staticmethod
    def _configuration(path: str) -> k8s.Configuration:
        configuration = k8s.Configuration(connection_pool_maxsize=CONNECTIONS_PER_CLIENT)
        k8s_config.load_kube_config(config_file=path, client_configuration=configuration, persist_config=False)
        return configuration


# Where a client that holds no credentials sends nothing: a name that never resolves (RFC 6761).
NO_SERVER = "https://credentials-refused.invalid"


class PeerKubeconfigFileClient(_FollowedKubeconfigClient):
    """A kubeconfig file another party wrote, parsed (`parse_peer_kubeconfig`) at every change.

    A refused file loads nothing: the client goes on with the last credentials it accepted, and until it
    has accepted any, every request fails here with InvalidCredentials, before anything is sent.
    `refusal` is the latest file's refusal (None once a good file follows); `namespace` the context's
    namespace of the credentials in use."""

    def __init__(self, path: str) -> None:
        self.refusal: InvalidKubeconfig | None = None
        self.credentials: PeerCredentials | None = None
        try:
            self.credentials = self._parse(path)
            configuration = peer_configuration(self.credentials)
        except InvalidKubeconfig as e:
            self.refusal = e
            configuration = k8s.Configuration(host=NO_SERVER)
            logging.getLogger(__name__).warning("kubeconfig %s refused: %s", path, e)
        super().__init__(path, configuration)

    @property
    def namespace(self) -> str | None:
        return None if self.credentials is None else self.credentials.namespace

    @staticmethod
    def _parse(path: str) -> PeerCredentials:
        try:
            with open(path, "rb") as f:
                text = f.read(MAX_KUBECONFIG_BYTES + 1)
        except OSError:
            raise InvalidKubeconfig("kubeconfig", "cannot be read") from None
        return parse_peer_kubeconfig(text)

    def _load(self) -> k8s.Configuration:
        credentials = self._parse(self._path)
        self.credentials, self.refusal = credentials, None
        return peer_configuration(credentials)

    def _refused(self, error: Exception) -> None:
        if isinstance(error, InvalidKubeconfig):
            self.refusal = error
            logging.getLogger(__name__).warning("kubeconfig %s refused, %s: %s", self._path,
                                                "the previous credentials kept" if self.credentials
                                                else "no credentials", error)  # fmt: skip
        else:
            super()._refused(error)

    def param_serialize(self, *args: Any, **kwargs: Any) -> Any:
        serialized = super().param_serialize(*args, **kwargs)
        if self.credentials is None:
            raise ApplicationError(f"the kubeconfig {self._path} was refused: {self.refusal}",
                                   type=INVALID_CREDENTIALS, non_retryable=True)  # fmt: skip
        return serialized


def _file_stamp(path: str) -> tuple[int, int, int, int] | None:
    """What changes when the file is rewritten or swapped (os.stat follows the kubelet's symlinks); None
    while it cannot be read (the client goes on with the credentials it has)."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


# A foreign cluster's client serves a push every period and idles in between: its kept-alive TLS connection
# held 143 KiB the whole time (700 MiB at 5,000 peerings), and a NAT or load balancer on the way may cut it
# anyway. Connections of clients that nobody asked for this long are closed; the next push opens one.
IDLE_CONNECTION_SECONDS = 60


def close_idle_connections(api: k8s.ApiClient) -> None:
    """Closes the client's kept-alive connections that no request is using; those in use are left alone,
    and the pools stay open."""
    manager = api.rest_client.pool_manager
    for key in manager.pools.keys():
        pool = manager.pools.get(key)
        idle = getattr(pool, "pool", None)  # urllib3's queue of idle connections (None: the pool is closed)
        if idle is None:
            continue
        taken = []
        while True:
            try:
                taken.append(idle.get(block=False))
            except queue.Empty:
                break
        for connection in taken:
            if connection is not None:
                connection.close()
            with contextlib.suppress(queue.Full):  # a connection came back meanwhile: it keeps the slot
                idle.put(None, block=False)


class SecretClients:
    """API clients built from kubeconfig Secrets of one cluster, cached by the Secret's resourceVersion
    so that a rotated credential is picked up and an unchanged one is not parsed again. The connections of
    a client not asked for in IDLE_CONNECTION_SECONDS are closed. Whose kubeconfigs they are decides how
    they are read: `PeerSecretClients` or `OwnSecretClients`."""

    @staticmethod
    def _client(text: bytes) -> k8s.ApiClient:
        raise NotImplementedError

    def __init__(self, home: k8s.ApiClient) -> None:
        self._core = k8s.CoreV1Api(home)
        self._cache: dict[tuple[str, str], tuple[str | None, k8s.ApiClient]] = {}
        self._used: dict[tuple[str, str], float] = {}  # monotonic time of the last get, while it may hold connections
        self._next_sweep = 0.0
        self._lock = threading.Lock()

    def get(self, *, name: str, namespace: str, key: str = "kubeconfig") -> k8s.ApiClient:
        api = self._get(name=name, namespace=namespace, key=key)
        now = monotonic()
        with self._lock:
            self._used[(namespace, name)] = now
            idle: list[k8s.ApiClient] = []
            if now >= self._next_sweep:
                self._next_sweep = now + IDLE_CONNECTION_SECONDS
                for cached in [k for k, used in self._used.items() if now - used > IDLE_CONNECTION_SECONDS]:
                    del self._used[cached]
                    if cached in self._cache:
                        idle.append(self._cache[cached][1])
        for client in idle:
            close_idle_connections(client)
        return api

    def _get(self, *, name: str, namespace: str, key: str) -> k8s.ApiClient:
        try:
            secret = self._core.read_namespaced_secret(name, namespace)
        except ApiException as e:
            if e.status == 404:
                raise ApplicationError(
                    f"Secret {namespace}/{name} with the foreign cluster's kubeconfig does not exist",
                    type=MISSING_CREDENTIALS,
                ) from None  # the response as a cause would reach the workflow's history
            raise
        version = secret.metadata.resource_version if secret.metadata else None
        with self._lock:
            cached = self._cache.get((namespace, name))
            if cached and version is not None and cached[0] == version:
                return cached[1]
            try:
                api = client_from_secret_data(secret.data, namespace=namespace, name=name, key=key, parse=self._client)
            except UnusableKubeconfigSecret as e:
                raise ApplicationError(
                    str(e), type=MISSING_CREDENTIALS if e.missing else INVALID_CREDENTIALS,
                    non_retryable=not e.missing,  # the same resourceVersion never parses
                ) from None
            self._cache[(namespace, name)] = (version, api)
            return api


class UnusableKubeconfigSecret(Exception):
    """A Secret's kubeconfig that gives no client; the message names the Secret, the key and the rule, never
    a value. `missing`: the key is absent or empty (may come later), else it is there and refused."""

    def __init__(self, message: str, *, missing: bool) -> None:
        super().__init__(message)
        self.missing = missing


def client_from_secret_data(data: Mapping[str, bytes | str] | None, *, namespace: str, name: str, key: str,
                            parse: Callable[[bytes], k8s.ApiClient]) -> k8s.ApiClient:  # fmt: skip
    """The client of the kubeconfig under `key` of a Secret's (base64) data, read by `parse`; the one reader of
    kubeconfig Secrets, so that every holder says the same of the same problem."""
    where = f"Secret {namespace}/{name} key {key!r}"
    encoded = (data or {}).get(key)
    if not encoded:
        raise UnusableKubeconfigSecret(f"Secret {namespace}/{name} has no key {key!r}", missing=True)
    try:
        return parse(base64.b64decode(encoded))
    except InvalidKubeconfig as e:  # names the field and the rule, never a value
        raise UnusableKubeconfigSecret(f"{where} refused: {e}", missing=False) from None
    except Exception as e:  # noqa: BLE001 - whatever the parser says may quote the Secret: say only where
        raise UnusableKubeconfigSecret(f"{where} does not hold a usable kubeconfig ({type(e).__name__})",
                                       missing=False) from None


class PeerSecretClients(SecretClients):
    """Kubeconfigs another party wrote (the PeeringRequests' `tidepool-peer-<consumer>`, the providers'
    `tidepool-kubeconfig-<provider>`): parsed into server, CA and token; any other field is refused,
    InvalidCredentials naming it."""

    @staticmethod
    def _client(text: bytes) -> k8s.ApiClient:
        return client_from_peer_kubeconfig_text(text)


class OwnSecretClients(SecretClients):
    """Kubeconfigs this cluster's operator put in Secrets (the pool's super clusters, by whoever runs the
    pool): the Kubernetes client's full loader, as for the operator's own files."""

    @staticmethod
    def _client(text: bytes) -> k8s.ApiClient:
        # libyaml's parser: the pure-Python one took a tenth of a worker's CPU when a thousand peerings started.
        api: k8s.ApiClient = k8s_config.new_client_from_config_dict(yaml.load(text, Loader=yaml.CSafeLoader))
        return api
