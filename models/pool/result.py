"""What one pool scheduling pass reports (activities/pool.py returns it, workflows/pool.py records it
and shows it in the Web UI). Its JSON shape is part of saved workflow histories: change it additively."""

from __future__ import annotations

from pydantic import BaseModel, Field


class PoolDecision(BaseModel):
    namespace: str
    placement: dict[str, int] | None
    reason: str
    diagnosis: dict[str, str] = Field(default_factory=dict)  # cluster -> why it got no (more) slices
    # What a placement was decided from (`tidepool explain namespace`); empty in passes of earlier releases.
    slice: dict[str, str] = Field(default_factory=dict)
    slices: int | None = None
    mandatory: dict[str, int] = Field(default_factory=dict)  # the user's entries it honoured


class PoolPassResult(BaseModel):
    clusters: dict[str, str] = Field(default_factory=dict)  # name -> "Ready, 14 free" / why not
    decisions: list[PoolDecision] = Field(default_factory=list)
    pods_placed: dict[str, str] = Field(default_factory=dict)  # namespace/pod -> cluster
    pods_unplaced: dict[str, str] = Field(default_factory=dict)  # namespace/pod -> why
    draining: dict[str, dict[str, int]] = Field(default_factory=dict)  # namespace -> clusters its slices leave


class MoveInput(BaseModel):
    """One namespace whose slices drain, for the saga's steps (move_pods, finish_move)."""

    namespace: str


class MoveProgress(BaseModel):
    """Where a namespace's move stands after `move_pods` or `finish_move`."""

    namespace: str
    draining: dict[str, int] = Field(default_factory=dict)  # cluster -> slices still draining
    moved: dict[str, str] = Field(default_factory=dict)  # pod -> "old → new", moved by this step
    waiting: list[str] = Field(default_factory=list)  # moved pods not Running yet
    stuck: dict[str, str] = Field(default_factory=dict)  # pod -> why it fits nowhere else
    finishable: list[str] = Field(default_factory=list)  # draining clusters whose move is over
