"""A cluster's tidepool worker: `python -m workers.cluster`, configured by TIDEPOOL_* variables (see
models/settings.py). It serves this cluster's task queue only, with the clients of this cluster, and,
while it holds the cluster's Lease (kube/lease.py), runs the watchers that turn Kubernetes changes into
workflow starts and signals: any number of replicas serve the task queue, one of them watches."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from pathlib import Path

from temporalio.client import Client, TLSConfig
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime
from temporalio.worker import Worker

from kube.clients import client_from_own_kubeconfig_file
from kube.lease import LeaderElection
from models.names import SYSTEM_NAMESPACE, worker_lease_name
from models.settings import LeaderSettings, TemporalSettings, WorkerSettings
from workers.consumer import consumer_role
from workers.errors import KubernetesErrors
from workers.health import HealthProbes
from workers.metrics import metrics_runtime
from workers.provider import provider_role
from workers.roles import Role, RoleContext

log = logging.getLogger("tidepool.worker")

# Activities are synchronous Kubernetes calls; each holds a thread while it waits on an API server. The
# worker takes no more activity tasks than it has threads: the SDK's default of 100 slots let 68 wait in
# the executor's queue with their start-to-close timeout running (60 s for a push), so that a burst of
# first pushes timed out while queued and was retried, which made the burst longer still. Tasks it does
# not take wait on the task queue, where another replica may take them and no timeout but
# schedule-to-start runs.
ACTIVITY_THREADS = 32


async def connect(settings: TemporalSettings, *, runtime: Runtime | None = None) -> Client:
    """A Temporal client for self-hosted (optionally mTLS) or Temporal Cloud (API key); the pydantic
    converter on every client, so models cross the wire as they validate. A worker built on it runs on
    `runtime` (workers/metrics.py: the Prometheus endpoint)."""
    tls: TLSConfig | bool = False
    if settings.tls_cert_file or settings.tls_ca_file:
        tls = TLSConfig(
            client_cert=Path(settings.tls_cert_file).read_bytes() if settings.tls_cert_file else None,
            client_private_key=Path(settings.tls_key_file).read_bytes() if settings.tls_key_file else None,
            server_root_ca_cert=Path(settings.tls_ca_file).read_bytes() if settings.tls_ca_file else None,
        )
    api_key = Path(settings.api_key_file).read_text().strip() if settings.api_key_file else None
    return await Client.connect(
        settings.address, namespace=settings.namespace, data_converter=pydantic_data_converter,
        tls=tls or bool(api_key), api_key=api_key, runtime=runtime,
    )  # fmt: skip


ROLES: list[Callable[[RoleContext], Role]] = [provider_role, consumer_role]


def replica_identity(settings: LeaderSettings) -> str:
    """This process's name in a Lease: the configured one (the pod's name), or one no other process has."""
    return settings.identity or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def leading(roles: list[Role]) -> tuple[Callable[[], None], Callable[[], None]]:
    """The election's callbacks: start every role's watchers, and stop them (the last started first)."""
    stops: list[Callable[[], None]] = []

    def started() -> None:
        stops.extend(role.lead() for role in roles)

    def stopped() -> None:
        while stops:
            stops.pop()()

    return started, stopped


async def run(settings: WorkerSettings, *, stop: asyncio.Event) -> None:
    probes = HealthProbes(settings.health.port).start()
    try:
        await _serve(settings, stop=stop, probes=probes)
    finally:
        probes.stop()


async def _serve(settings: WorkerSettings, *, stop: asyncio.Event, probes: HealthProbes) -> None:
    client = await connect(settings.temporal, runtime=metrics_runtime(settings.metrics.port, service="worker"))
    ctx = RoleContext(
        client=client, home=client_from_own_kubeconfig_file(settings.cluster.kubeconfig), settings=settings,
        loop=asyncio.get_running_loop(),
    )  # fmt: skip
    roles = [build(ctx) for build in ROLES]
    async with AsyncExitStack() as stack:
        executor = stack.enter_context(ThreadPoolExecutor(ACTIVITY_THREADS, thread_name_prefix="activity"))
        worker = Worker(
            client,
            task_queue=settings.task_queue,
            workflows=[w for role in roles for w in role.workflows],
            activities=[a for role in roles for a in role.activities],
            activity_executor=executor,
            max_concurrent_activities=ACTIVITY_THREADS,
            interceptors=[KubernetesErrors()],
        )
        await stack.enter_async_context(worker)
        for role in roles:
            role.start()
            stack.callback(role.stop)
        started, stopped = leading(roles)
        election = LeaderElection(
            ctx.home, lease=worker_lease_name(settings.cluster.cluster_id), namespace=SYSTEM_NAMESPACE,
            identity=replica_identity(settings.leader), settings=settings.leader,
            on_started_leading=started, on_stopped_leading=stopped,
        ).start()  # fmt: skip
        stack.callback(election.stop)  # first of all at exit: the watchers stop and the Lease is handed on
        log.info("worker for cluster %s on task queue %s: %s", settings.cluster.cluster_id, settings.task_queue,
                 ", ".join(role.name for role in roles))  # fmt: skip
        probes.ready()  # connected, its Temporal worker polling, its roles started
        await stop.wait()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = WorkerSettings.from_env(os.environ)

    async def _main() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await run(settings, stop=stop)

    asyncio.run(_main())


if __name__ == "__main__":
    main()
