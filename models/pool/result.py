"""What one pool scheduling pass reports (activities/pool.py returns it, workflows/pool.py records it
and shows it in the Web UI). Its JSON shape is part of saved workflow histories: change it additively."""

from __future__ import annotations

from pydantic import BaseModel, Field


class PoolDecision(BaseModel):
    namespace: str
    placement: dict[str, int] | None
    reason: str
    diagnosis: dict[str, str] = Field(default_factory=dict)  # cluster -> why it got no (more) slices
    # What a placement was decided from (`tidepool explain namespace`).
    slice: dict[str, str] = Field(default_factory=dict)
    slices: int | None = None
    mandatory: dict[str, int] = Field(default_factory=dict)  # the user's entries it honoured


# A pass records its inputs for `tidepool simulate pool` only up to these sizes (bytes in one history event:
# about 180 per namespace, 150 per cluster); a larger pass records none, and the replay counts it as not
# replayable.
MAX_POOL_ENTRIES = 500
MAX_POOL_CLUSTERS = 100


class PoolClusterRecord(BaseModel):
    """A super cluster as the pass saw it (models/pool/placement.ClusterSnapshot, without what slices hold)."""

    name: str
    health: str
    allocatable: dict[str, str] = Field(default_factory=dict)
    headroom: dict[str, str] = Field(default_factory=dict, description="What it keeps free.")


class PoolNamespaceEntry(BaseModel):
    """A namespace with a quota, as one pass left it (models.pool.namespaces.live_entry)."""

    namespace: str
    slice: dict[str, str] = Field(default_factory=dict, description="Asked for; a refused one's: the slice it holds.")
    slices: int = 0
    placement: dict[str, int] = Field(default_factory=dict, description="As it stands after the pass.")
    mandatory: dict[str, int] = Field(default_factory=dict, description="The user's entries, honoured under any policy.")
    policy: str | None = Field(default=None, description="Its own policy annotation; None: the pool's.")
    refused: str | None = Field(default=None, description="A refusal no policy changes (InvalidSlice, ...).")
    edit: dict[str, int] = Field(default_factory=dict, description="The placement a user wrote since the scheduler's.")
    cleared: bool = Field(default=False, description="A user cleared the placement the scheduler wrote.")


class PoolPassResult(BaseModel):
    clusters: dict[str, str] = Field(default_factory=dict)  # name -> "Ready, 14 free" / why not
    decisions: list[PoolDecision] = Field(default_factory=list)
    pods_placed: dict[str, str] = Field(default_factory=dict)  # namespace/pod -> cluster
    pods_unplaced: dict[str, str] = Field(default_factory=dict)  # namespace/pod -> why
    draining: dict[str, dict[str, int]] = Field(default_factory=dict)  # namespace -> clusters its slices leave
    # The inputs `tidepool simulate pool` replays (issue 20); None past the sizes above.
    policy: str | None = None  # the pool's (ClusterConfig spec.pool.policy)
    snapshot: list[PoolClusterRecord] | None = None
    live: list[PoolNamespaceEntry] | None = None


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
