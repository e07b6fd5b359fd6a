"""The commands README.md and docs/ give users, run exactly as written against the local environment as
`make demo` leaves it: the `tidepool explain`, `simulate` and `status` lines and the `temporal workflow`
lines of every `sh` or `bash` block. Transcripts (`text` blocks, `$ ...` with a test's ids) are output, not
commands. What the commands read is set up the demo's way: a provider `cluster-a` and a consumer
`cluster-b` (under acceptPolicy Manual, so that the documented `accept` decides) with their workers in
Temporal namespaces of the same names, peered by the documented `tidepool peer`; the pool's scheduler in
`cluster-tenant` with the demo's `team-red/api`; the state file recording them, found through
TIDEPOOL_LOCALENV_STATE (the demo's is the repository's .tidepool/localenv/state.json); a.kubeconfig and
b.kubeconfig in the working directory. Placeholders (POD) are the one substitution."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter

from deploy.localenv.binaries import temporal_cli
from deploy.localenv.clusters import LocalCluster
from deploy.localenv.deployments import DeploymentRunner
from deploy.localenv.env import EnvState
from kube.objects import read_cluster_object
from models.names import (
    ADVERTISEMENTS,
    PLACEMENTS_ANNOTATION,
    POD_CLUSTER_ANNOTATION,
    POOL_SCHEDULER_WORKFLOW_ID,
    SYSTEM_NAMESPACE,
    advertisement_name,
)
from tests.kube import apply_cluster_config, create_namespace, create_node, create_pod
from tests.pool import running_pool
from tests.running import eventually, running_worker, worker_settings
from workers.cli import LOCAL_ENV_STATE_VARIABLE, POOL_WORKER

pytestmark = [pytest.mark.env, pytest.mark.explain]

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = re.compile(r"(tidepool (explain|simulate|status|peer)|temporal workflow)\b")
# Documented commands this test does not run, each with why. Keep it short: a command belongs here only
# when no local environment can run it as written.
NOT_RUN: dict[str, str] = {}
PROVIDER, CONSUMER = "cluster-a", "cluster-b"
POD = "documented"  # the consumer's pod that stands for POD


def documented_commands() -> list[tuple[str, list[str]]]:
    """(where, argv) of every line of a `sh` or `bash` block that RUN matches, backslash continuations
    joined and comments dropped, once each, in the order the documents give them."""
    found: dict[tuple[str, ...], str] = {}
    for document in DOCUMENTS:
        language, pending, start = None, "", 0
        for number, line in enumerate(document.read_text().splitlines(), 1):
            if line.startswith("```"):
                language = line[3:].strip() if language is None else None
                continue
            if language not in ("sh", "bash"):
                continue
            start = start if pending else number
            pending += line.rstrip("\\") + " "
            if line.endswith("\\"):
                continue
            text, pending = pending.strip(), ""
            if RUN.match(text):
                argv = tuple(shlex.split(text, comments=True))
                found.setdefault(argv, f"{document.relative_to(ROOT)}:{start}")
    return [(where, list(argv)) for argv, where in found.items()]


def _stage(argv: list[str]) -> int:
    """When a command can run: the peering first, then its Advertisement decided by hand, then the readers."""
    if argv[:2] == ["tidepool", "peer"]:
        return 0
    if argv[0] == "temporal":
        return 2 if any("advertisement" in a.lower() for a in argv) else 1
    return 3


def test_the_documents_give_commands_to_run_and_the_allow_list_names_only_documented_ones() -> None:
    commands = [" ".join(argv) for _, argv in documented_commands()]
    kinds = {" ".join(c.split()[:3]) for c in commands}
    assert {"tidepool explain peering", "tidepool simulate pool", "tidepool status", "temporal workflow update"} <= kinds
    assert set(NOT_RUN) <= set(commands), "an allow-listed command is no longer documented"


@asynccontextmanager
async def _peering_workers(localenv: EnvState, provider: LocalCluster, consumer: LocalCluster) -> AsyncIterator[None]:
    """The two workers as the demo runs them: each cluster id in the Temporal namespace of the same name; and
    the consumer's virtual kubelets."""
    async with AsyncExitStack() as stack:
        for cluster, cluster_id in ((provider, PROVIDER), (consumer, CONSUMER)):
            settings = worker_settings(localenv, cluster, cluster_id, namespace=cluster_id)
            await stack.enter_async_context(running_worker(settings))
        stack.enter_context(DeploymentRunner(consumer.kubeconfig))
        yield


def _state(localenv: EnvState, kubeconfigs: dict[str, Path], path: Path) -> None:
    """What `make demo` records, with this test's clusters and workers."""
    state = asdict(localenv) | {
        "kubeconfigs": {name: str(kubeconfig) for name, kubeconfig in kubeconfigs.items()},
        "cluster_ids": {"a": PROVIDER, "b": CONSUMER},
        "worker_namespaces": {PROVIDER: PROVIDER, CONSUMER: CONSUMER, POOL_WORKER: "cluster-tenant"},
    }  # fmt: skip
    path.write_text(json.dumps(state, indent=2))


async def _run(argv: list[str], *, cwd: Path, env: dict[str, str]) -> tuple[int, str, str]:
    program = [str(temporal_cli())] if argv[0] == "temporal" else [sys.executable, "-m", "workers.cli"]
    process = await asyncio.create_subprocess_exec(*program, *argv[1:], cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE)  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), timeout=90)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


TENANT = "tenant"  # the demo's first tenant, as the documented commands name it


def _sensible(argv: list[str], out: str) -> str | None:
    """What is missing from a command's output, if anything: each command says something of its subject."""
    words = " ".join(argv)
    expected = {
        "tidepool status": [f"{PROVIDER}  {CONSUMER}", f"{CONSUMER}  {PROVIDER}", "team-red"],
        "tidepool explain peering": ["offered cpu"],
        "tidepool explain advertisement": ["admission: Accepted"],
        "tidepool explain namespace": ["slices placed"],
        "tidepool explain pod team-red/api": ["pod api →"],
        f"tidepool explain pod shop/{POD}": [f"pod shop/{POD}"],
        "tidepool simulate peering": ["pushes replayed"],
        "tidepool simulate admission": ["passes replayed"],
        "tidepool simulate pool": ["passes replayed"],
        "temporal workflow query": ["sharing_percentage"],
        "temporal workflow list -n cluster-a": [f"peering-{CONSUMER}@{PROVIDER}"],
    }
    for prefix, phrases in expected.items():
        if words.startswith(prefix):
            return next((f"{phrase!r} not in the output" for phrase in phrases if phrase not in out), None)
    return None


@pytest.mark.timeout(300)
async def test_every_documented_command_runs_as_written_on_the_demo_s_environment(
    localenv: EnvState, make_cluster: Callable[[str], LocalCluster], unique: str, tmp_path: Path,
) -> None:  # fmt: skip
    commands = [(where, argv) for where, argv in documented_commands() if " ".join(argv) not in NOT_RUN]
    provider, consumer = make_cluster("prov"), make_cluster("cons")
    create_node(provider.api_client(), "big", cpu="8", memory="16Gi")
    apply_cluster_config(provider.api_client(), outgoing={"sharingPercentage": 40})
    create_namespace(consumer.api_client(), SYSTEM_NAMESPACE)
    apply_cluster_config(consumer.api_client(), incoming={"acceptPolicy": "Manual"})
    create_namespace(consumer.api_client(), "shop")
    create_pod(consumer.api_client(), "shop", POD, requests={"cpu": "100m"})
    for name, cluster in (("a", provider), ("b", consumer)):
        (tmp_path / f"{name}.kubeconfig").symlink_to(cluster.kubeconfig)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TEMPORAL_ADDRESS=localenv.temporal_address,
               **{LOCAL_ENV_STATE_VARIABLE: str(tmp_path / "state.json")})  # fmt: skip
    for variable in ("TIDEPOOL_TEMPORAL_ADDRESS", "TIDEPOOL_TEMPORAL_NAMESPACE", "TIDEPOOL_CLUSTER_CLUSTER_ID"):
        env.pop(variable, None)  # a user of the demo sets none
    failed: list[str] = []

    async def run(stage: int) -> None:
        for where, argv in (c for c in commands if _stage(c[1]) == stage):
            argv = [a.replace("POD", POD) for a in argv]
            code, out, err = await _run(argv, cwd=tmp_path, env=env)
            problem = f"exit {code}: {err.strip()[-400:]}" if code else _sensible(argv, out)
            if problem:
                failed.append(f"{where}: {shlex.join(argv)}\n    {problem}")

    def advertisement() -> dict[str, Any]:
        return read_cluster_object(consumer.api_client(), ADVERTISEMENTS, advertisement_name(PROVIDER)) or {}

    tenant_namespace = "cluster-tenant"
    async with (running_pool(localenv, make_cluster, unique, namespace=tenant_namespace, tenant_name=TENANT,
                             workflow_id=POOL_SCHEDULER_WORKFLOW_ID) as pool,
                _peering_workers(localenv, provider, consumer)):  # fmt: skip
        _state(localenv, {"a": provider.kubeconfig, "b": consumer.kubeconfig, "tenant": pool.tenant.kubeconfig},
               tmp_path / "state.json")  # fmt: skip
        core = pool.core  # the demo's tenant namespace and pod
        core.create_namespace(k8s.V1Namespace.model_validate({"metadata": {"name": "team-red"}}))
        core.create_namespaced_resource_quota("team-red", k8s.V1ResourceQuota.model_validate(
            {"metadata": {"name": "quota"}, "spec": {"hard": {"cpu": "2", "memory": "4Gi"}}}))  # fmt: skip
        await eventually(lambda: PLACEMENTS_ANNOTATION in (core.read_namespace("team-red").metadata.annotations or {}),
                         timeout=60, what="team-red placed")  # fmt: skip
        create_pod(pool.tenant.api_client(), "team-red", "api", requests={"cpu": "500m", "memory": "1Gi"})

        await run(0)
        await run(1)
        await eventually(lambda: (advertisement().get("status") or {}).get("phase") == "Pending", timeout=60,
                         what="the Advertisement waiting for a decision")  # fmt: skip
        await run(2)
        await eventually(lambda: (advertisement().get("status") or {}).get("phase") == "Accepted", timeout=60,
                         what="the Advertisement accepted by the documented update")  # fmt: skip
        await eventually(lambda: (core.read_namespaced_pod("api", "team-red").metadata.annotations or {}).get(
            POD_CLUSTER_ANNOTATION), timeout=60, what="team-red/api's super cluster")  # fmt: skip
        await run(3)
        # The tenant control plane is the management cluster too (its Tenant's kubeconfig names its server): its
        # placements are shown once, as the Tenant's, beside the Tenants table.
        code, out, err = await _run(["tidepool", "status"], cwd=tmp_path, env=env)
        placed = re.findall(r"^  (\S+) +team-red +\S", out.partition("Pool placements")[2].partition("Pool pods")[0], re.M)
        if code or placed != [TENANT] or not re.search(rf"^Tenants\n.*\n  {TENANT} +\S+ +1 +True \(Reachable\)", out, re.M):
            failed.append(f"tidepool status: the tenant's placement as {placed}, not once as {TENANT}'s, or no "
                          f"Tenants row (exit {code}):\n{out}{err}")  # fmt: skip
        # A cluster id the state does not know: the default namespace is read, and the error names the flag.
        code, _, err = await _run(["tidepool", "explain", "peering", CONSUMER, "--cluster-id", "cluster-x"],
                                  cwd=tmp_path, env=env)  # fmt: skip
        if code != 1 or "the namespace came from the default; give the cluster's own with --namespace NS" not in err:
            failed.append(f"an unknown --cluster-id: exit {code}, {err.strip()[-400:]}")
    await _forget_runs(localenv, [PROVIDER, CONSUMER, tenant_namespace])
    assert not failed, "documented commands that do not work as written:\n" + "\n".join(failed)


async def _forget_runs(localenv: EnvState, namespaces: list[str]) -> None:
    """The runs this test left open in the demo's namespaces, terminated: a later run on a reused environment
    (TIDEPOOL_TEST_STATE) starts its own instead of finding these, whose clusters are gone. (The test cannot
    share an environment with a running demo: its workers would serve the demo's task queues.)"""
    for namespace in namespaces:
        client = await Client.connect(localenv.temporal_address, namespace=namespace, data_converter=pydantic_data_converter)
        async for run in client.list_workflows("ExecutionStatus = 'Running'"):
            if run.status == WorkflowExecutionStatus.RUNNING:
                await client.get_workflow_handle(run.id, run_id=run.run_id).terminate("test_documented_commands ended")
