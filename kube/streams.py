"""List-then-watch, the one way tidepool follows an API server: every watch of a process is a task on one
shared event loop, in one thread (`StreamLoop.shared()`), and its HTTP goes through aiohttp with the address
and credentials of the synchronous client the rest of tidepool uses for that cluster (`Endpoint`), so a
rotated credential reaches both. A thread per watch held 5,000 threads (over a gigabyte) at 5,000 peerings,
and every woken one competed with the worker's own event loop for the interpreter.

Level-triggered, like controller-runtime's informers: after every (re)list the handler gets the full set of
objects (`on_sync`), then each change (`on_event`). A watch that expires (410 Gone) or breaks is answered by
a fresh list, so a missed event can only delay a handler, never mislead it. Lists are paginated; an optional
`transform` (client-go's) turns each object into what the handler keeps as soon as its page is parsed, so a
list of 100,000 pods is never held whole. kube/informer.py adapts this to a client's list method and runs
the handlers off the loop; the provider's foreign watches (workers/decision_watch.py, provider_watches.py)
use it directly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import ssl
import threading
from asyncio import selector_events, sslproto
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import aiohttp
from kubernetes import client as k8s

log = logging.getLogger(__name__)

Obj = dict[str, Any]
PAGE_SIZE = 5000
WATCH_TIMEOUT_SECONDS = 300
CONNECT_TIMEOUT_SECONDS = 10
# A list of one object answers in well under this; a watch is closed by the server after
# WATCH_TIMEOUT_SECONDS, so a read silent for longer means a connection that hangs.
LIST_READ_TIMEOUT_SECONDS = 30
WATCH_READ_TIMEOUT_SECONDS = WATCH_TIMEOUT_SECONDS + 30
# aiohttp refuses a line (one watch event) above its read buffer: objects up to this size pass.
MAX_OBJECT_BYTES = 4 * 1024 * 1024
# A page above this is parsed off the loop: a json.loads of a page of up to PAGE_SIZE pods would hold up every
# other watch of the process while it runs.
PARSE_ON_LOOP_MAX_BYTES = 256 * 1024


# asyncio gives every TLS connection a 256 KiB read buffer (sslproto.SSLProtocol.max_size): an open watch
# cost 341 KiB, 1.6 GB at 5,000 peerings. A watch reads one small event at a time, and a TLS record holds
# at most 16 KiB, so the streams' loop reads in records: 100 KiB a watch.
TLS_READ_BUFFER_BYTES = 16 * 1024


class _LeanTLS(sslproto.SSLProtocol):
    max_size = TLS_READ_BUFFER_BYTES


class _StreamsEventLoop(asyncio.SelectorEventLoop):
    # selector_events.BaseSelectorEventLoop._make_ssl_transport (3.11 to 3.13), with the lean protocol.
    def _make_ssl_transport(self, rawsock: Any, protocol: Any, sslcontext: Any, waiter: Any = None, *,
                            server_side: bool = False, server_hostname: str | None = None, extra: Any = None,
                            server: Any = None, **timeouts: Any) -> Any:  # fmt: skip
        ssl_protocol = _LeanTLS(self, protocol, sslcontext, waiter, server_side, server_hostname, **timeouts)
        selector_events._SelectorSocketTransport(self, rawsock, ssl_protocol, extra=extra, server=server)  # type: ignore[attr-defined]
        return ssl_protocol._app_transport


class StreamLoop:
    """One daemon thread running one asyncio event loop, started on first use, and one HTTP session for
    every stream on it (aiohttp keeps a connection per server and TLS settings, so none is shared between
    two clusters or two sets of credentials)."""

    _shared: StreamLoop | None = None
    _shared_lock = threading.Lock()

    def __init__(self, name: str) -> None:
        self.loop = _StreamsEventLoop()
        self._session: aiohttp.ClientSession | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    @classmethod
    def shared(cls) -> StreamLoop:
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = StreamLoop("kube-streams")
            return cls._shared

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> concurrent.futures.Future[None]:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def session(self) -> aiohttp.ClientSession:
        """On the loop only."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), read_bufsize=MAX_OBJECT_BYTES
            )
        return self._session


class StatusError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status} {reason}")
        self.status = status


class Endpoint:
    """One API server, as one synchronous client reaches it: its address, TLS and credentials."""

    def __init__(self, api: k8s.ApiClient, session: aiohttp.ClientSession) -> None:
        self.api = api
        self._session = session
        configuration = api.configuration
        self._host = configuration.host.rstrip("/")
        self._ssl: ssl.SSLContext | bool = False
        self._server_hostname = configuration.tls_server_name or None
        self._proxy = configuration.proxy or None  # a kubeconfig's proxy-url
        if self._host.startswith("https"):
            context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
            if configuration.cert_file:
                context.load_cert_chain(configuration.cert_file, configuration.key_file)
            if not configuration.verify_ssl:
                context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            self._ssl = context

    def _headers(self) -> dict[str, str]:
        # Read at each request, as the synchronous client does: a refresh hook may have renewed a token.
        settings = self.api.configuration.auth_settings().values()
        return {"Accept": "application/json",
                **{s["key"]: s["value"] for s in settings if s["in"] == "header" and s["value"]}}  # fmt: skip

    async def list(self, path: str, params: dict[str, str]) -> Obj:
        timeout = aiohttp.ClientTimeout(sock_connect=CONNECT_TIMEOUT_SECONDS, sock_read=LIST_READ_TIMEOUT_SECONDS)
        async with self._get(path, params, timeout) as response:
            if response.status != 200:
                raise StatusError(response.status, response.reason or "")
            body = await response.read()
        if len(body) <= PARSE_ON_LOOP_MAX_BYTES:
            page: Obj = json.loads(body)
        else:
            page = await asyncio.get_running_loop().run_in_executor(None, json.loads, body)
        return page

    async def watch(self, path: str, params: dict[str, str], on_open: Callable[[], None] = lambda: None,
                    ) -> AsyncIterator[tuple[str, Obj]]:  # fmt: skip
        """The events of one watch request, until the server ends it; an ERROR event raises StatusError.
        `on_open` is called once the server has taken the watch."""
        timeout = aiohttp.ClientTimeout(sock_connect=CONNECT_TIMEOUT_SECONDS, sock_read=WATCH_READ_TIMEOUT_SECONDS)
        params = dict(params, watch="true", allowWatchBookmarks="true", timeoutSeconds=str(WATCH_TIMEOUT_SECONDS))
        async with self._get(path, params, timeout) as response:
            if response.status != 200:
                raise StatusError(response.status, response.reason or "")
            on_open()
            async for line in response.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":  # 410 Gone among them: the caller lists again
                    raise StatusError(int(obj.get("code") or 500), str(obj.get("message") or "watch error"))
                yield str(kind), obj

    def _get(self, path: str, params: dict[str, str], timeout: aiohttp.ClientTimeout) -> Any:
        return self._session.get(f"{self._host}{path}", params=params, headers=self._headers(), timeout=timeout,
                                 ssl=self._ssl, server_hostname=self._server_hostname, proxy=self._proxy)  # fmt: skip


class ClientEndpoint:
    """The Endpoint of one synchronous client as it is now: a client that follows its kubeconfig file
    (kube/clients.py) is asked to (off the loop: a stat, and a read when the file changed) before every list
    and watch, and a new configuration gets a new Endpoint, so rotated credentials are picked up."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self._api = api
        self._endpoint: Endpoint | None = None
        self._configuration: Any = None

    async def __call__(self) -> Endpoint:
        follow = getattr(self._api, "follow", None)
        if follow is not None:
            await asyncio.get_running_loop().run_in_executor(None, follow)
        configuration = self._api.configuration
        if self._endpoint is None or self._configuration is not configuration:
            self._endpoint = Endpoint(self._api, StreamLoop.shared().session())
            self._configuration = configuration
        return self._endpoint


async def on_the_loop(call: Callable[[], None]) -> None:
    """Handlers that only update memory run where the stream runs."""
    call()


def _as_is(obj: Obj) -> Any:
    return obj


async def list_then_watch(
    name: str,
    endpoint: Callable[[], Awaitable[Endpoint]],
    path: str,
    params: dict[str, str],
    *,
    on_sync: Callable[[list[Any]], None],
    on_event: Callable[[str, Any], None],
    on_failure: Callable[[int], Awaitable[None]],
    lists: asyncio.Semaphore | None = None,
    transform: Callable[[Obj], Any] = _as_is,
    deliver: Callable[[Callable[[], None]], Awaitable[None]] = on_the_loop,
) -> None:
    """Lists (page by page, each object transformed as its page is parsed), then watches from the list's
    version, for ever (until cancelled). `endpoint` is asked again before every page and watch, so rotated
    credentials are picked up. A list that fails (a handler that raises on it too), or a watch that the
    server does not take, is a failure: before the next list `on_failure` gets the count of them in a row
    and returns when to try again. `lists` bounds the lists at once. Every call of `on_sync` and `on_event`
    goes through `deliver`, which decides where handlers run and waits for them: events reach a handler
    one at a time, in order."""
    failures = 0

    def opened() -> None:
        nonlocal failures
        failures = 0  # a list and a watch went through: the cluster is back

    while True:
        if failures:
            await on_failure(failures)
        try:
            async with lists or contextlib.nullcontext():
                items, version = await _list(endpoint, path, params, transform)
            await deliver(functools.partial(on_sync, items))
            del items  # the handler keeps what it keeps
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a watcher must outlive any one failure
            failures += 1
            log.warning("stream %s: list failed: %s", name, e)
            continue
        failures += 1  # until the server takes a watch
        try:
            while True:
                async for kind, obj in (await endpoint()).watch(path, dict(params, resourceVersion=version), opened):
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    if kind != "BOOKMARK":
                        await deliver(functools.partial(on_event, kind, transform(obj)))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - expired (410) or broken: a fresh list is the truth
            log.info("stream %s: watch ended (%s); listing again", name, e)


async def _list(endpoint: Callable[[], Awaitable[Endpoint]], path: str, params: dict[str, str],
                transform: Callable[[Obj], Any]) -> tuple[list[Any], str]:  # fmt: skip
    """Every page of a list, transformed, and the version to watch from (the last page's)."""
    items: list[Any] = []
    token: str | None = None
    while True:
        query = dict(params, limit=str(PAGE_SIZE), **({"continue": token} if token else {}))
        page = await (await endpoint()).list(path, query)
        items.extend(map(transform, page.get("items") or []))
        metadata = page.get("metadata") or {}
        del page  # one parsed page at a time
        token = metadata.get("continue")
        if not token:
            return items, str(metadata["resourceVersion"])
