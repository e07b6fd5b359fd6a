"""What a part of the worker brings: its workflows, its activities, what every replica runs beside them
(`start`/`stop`: the capacity aggregate its activities read), and the watchers that only the replica
holding the Lease runs (`lead`: starts them and returns their stop; kube/lease.py). workers/cluster.py
composes the roles a cluster runs (provider, consumer) on its one task queue."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from temporalio.client import Client

from models.settings import WorkerSettings


@dataclass(frozen=True)
class RoleContext:
    client: Client
    home: k8s.ApiClient
    settings: WorkerSettings
    loop: asyncio.AbstractEventLoop


def _nothing() -> None:
    pass


def _leads_nothing() -> Callable[[], None]:
    return _nothing


@dataclass
class Role:
    name: str
    workflows: list[type] = field(default_factory=list)
    activities: list[Callable[..., Any]] = field(default_factory=list)
    start: Callable[[], None] = _nothing
    stop: Callable[[], None] = _nothing
    # Called each time this replica comes to lead: fresh watchers (a stopped informer stays stopped), whose
    # first list tells the workflows the state as it is, as after a restart.
    lead: Callable[[], Callable[[], None]] = _leads_nothing
