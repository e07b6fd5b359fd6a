"""What one pool scheduling pass reports (activities/pool.py returns it, workflows/pool.py records it
and shows it in the Web UI). Its JSON shape is part of saved workflow histories: change it additively."""

from __future__ import annotations

from pydantic import BaseModel, Field


class PoolDecision(BaseModel):
    namespace: str
    placement: dict[str, int] | None
    reason: str
    diagnosis: dict[str, str] = Field(default_factory=dict)


class PoolPassResult(BaseModel):
    clusters: dict[str, str] = Field(default_factory=dict)  # name -> "Ready, 14 free" / why not
    decisions: list[PoolDecision] = Field(default_factory=list)
    pods_placed: dict[str, str] = Field(default_factory=dict)  # namespace/pod -> cluster
    pods_unplaced: dict[str, str] = Field(default_factory=dict)  # namespace/pod -> why
