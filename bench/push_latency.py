"""push_latency: a change of the sharing percentage → the foreign cluster's Advertisement shows it.

A home and a foreign cluster of the benchmark's own, the home cluster's real worker (workers/cluster.py,
run as the tests run it) and a peering requested as `tidepool peer` does. The home cluster has one node of
100 CPU, so the advertised cpu is the percentage itself. Each sample changes the percentage and waits for
the Advertisement, watched on the foreign cluster, that carries it:

- `signal`: the `set_sharing_percentage` signal, until the Advertisement arrives;
- `update`: the validated `update_sharing_percentage` update, until the Advertisement arrives (the
  update itself returns once the push is done; its own time is in the params);
- baseline: a bare signal → activity round trip on the same server and in the same process (bench/echo.py).

The three are interleaved, sample by sample, so that they share the machine's noise.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from temporalio.client import WorkflowHandle
from temporalio.worker import Worker

from bench.common import AdvertisementWatch, emit, local_env, log, percentile
from bench.echo import EchoActivities, EchoWorkflow
from models.names import advertisement_name, peering_workflow_id
from models.peering import WithdrawResult
from tests.kube import apply_cluster_config, create_node
from tests.running import running_worker, worker_settings
from workers.cluster import connect
from workers.peer import request_peering
from workflows.peering import PeeringWorkflow

DEFAULTS: dict[str, Any] = {"changes": 200}
NODE_CPU = "100"


def _percentages(count: int, start: int) -> list[int]:
    """`count` values in 1–100, each different from the one before."""
    return [(start + i) % 100 + 1 for i in range(1, count + 1)]


async def _measure(params: dict[str, Any]) -> None:
    changes = int(params["changes"])
    with local_env(["home", "foreign"]) as env:
        home, foreign = env.cluster("home"), env.cluster("foreign")
        home_api, foreign_api = home.api_client(), foreign.api_client()
        create_node(home_api, "n1", cpu=NODE_CPU, memory="100Gi", pods="1000")
        apply_cluster_config(home_api, outgoing={"sharingPercentage": 1})
        home_id, foreign_id = "bench-home", "bench-foreign"
        settings = worker_settings(env, home, home_id)
        client = await connect(settings.temporal)
        samples: dict[str, list[float]] = {"baseline": [], "signal": [], "update": [], "update_call": []}
        echoed: dict[int, float] = {}
        echo_queue = f"bench-echo-{uuid.uuid4().hex[:8]}"
        with AdvertisementWatch(foreign_api, advertisement_name(home_id)) as watch:
            request_peering(home_api, foreign_api, provider_id=home_id, consumer_id=foreign_id)
            async with (
                running_worker(settings),
                Worker(client, task_queue=echo_queue, workflows=[EchoWorkflow],
                       activities=[EchoActivities(lambda v, at: echoed.__setitem__(v, at)).echo]),
            ):  # fmt: skip
                await asyncio.to_thread(watch.wait_for, "1", after=0, timeout=120)
                log("first Advertisement on the foreign cluster; measuring")
                peering: WorkflowHandle[PeeringWorkflow, WithdrawResult] = client.get_workflow_handle_for(
                    PeeringWorkflow.run, peering_workflow_id(home_id, foreign_id))
                echo = await client.start_workflow(EchoWorkflow.run, id=f"bench-echo-{uuid.uuid4().hex[:8]}",
                                                   task_queue=echo_queue)  # fmt: skip
                values = _percentages(2 * changes, start=1)
                for i in range(changes):
                    started = time.perf_counter()
                    await echo.signal(EchoWorkflow.ping, i)
                    while i not in echoed:
                        await asyncio.sleep(0.001)
                    samples["baseline"].append(echoed[i] - started)

                    value = values[2 * i]
                    started = time.perf_counter()
                    await peering.signal(PeeringWorkflow.set_sharing_percentage, value)
                    seen = await asyncio.to_thread(watch.wait_for, str(value), after=started)
                    samples["signal"].append(seen - started)

                    value = values[2 * i + 1]
                    started = time.perf_counter()
                    await peering.execute_update(PeeringWorkflow.update_sharing_percentage, value)
                    samples["update_call"].append(time.perf_counter() - started)
                    seen = await asyncio.to_thread(watch.wait_for, str(value), after=started)
                    samples["update"].append(seen - started)
                    if (i + 1) % 50 == 0:
                        log(f"{i + 1}/{changes} changes")
                await echo.signal(EchoWorkflow.stop)
                await echo.result()
    _report(samples, changes)


def _report(samples: dict[str, list[float]], changes: int) -> None:
    ms = {k: [1000 * v for v in vs] for k, vs in samples.items()}
    base = {p: percentile(ms["baseline"], p) for p in (50, 99)}
    for kind in ("signal", "update"):
        for p in (50, 99):
            params: dict[str, Any] = {"changes": changes, "percentile": p,
                      "baseline": "signal → activity start of a bare workflow, same server and process",
                      "target": "p50 ≤ 2× baseline" if p == 50 else "p99 ≤ 300 ms"}  # fmt: skip
            if kind == "update":
                params["update_call_ms"] = round(percentile(ms["update_call"], p), 2)
            emit(f"push_latency.{kind}.p{p}", percentile(ms[kind], p), "ms", baseline=base[p], params=params)


def run(params: dict[str, Any]) -> None:
    asyncio.run(_measure(params))
