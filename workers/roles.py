"""What a part of the worker brings: its workflows, its activities, and watchers to start and stop.
workers/cluster.py composes the roles a cluster runs (provider, consumer) on its one task queue."""

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


@dataclass
class Role:
    name: str
    workflows: list[type] = field(default_factory=list)
    activities: list[Callable[..., Any]] = field(default_factory=list)
    start: Callable[[], None] = lambda: None
    stop: Callable[[], None] = lambda: None
