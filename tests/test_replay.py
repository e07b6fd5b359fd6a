"""Histories saved from real runs of each release (tests/histories/<release>/) replay with the current
workflow code: a change that would break a workflow a released version began fails here. Workflow
changes after a release are guarded by `workflow.patched` against these (docs/upgrades.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory

from tests.replay import HISTORIES, RELEASE, releases, replayer

SAVED = sorted(path for release in releases() for path in release.glob("*.json"))
LONG_RUNNING = {"peering", "admission", "advertisement", "pool"}


@pytest.mark.parametrize("path", SAVED, ids=[f"{p.parent.name}/{p.stem}" for p in SAVED])
async def test_a_saved_history_replays_with_the_current_code(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    await replayer().replay_workflow(history)


def test_saved_histories_exist_for_every_long_running_workflow() -> None:
    saved = releases()
    assert saved, (f"no release's histories in {HISTORIES}: record them for {RELEASE} on the local environment "
                   "with TIDEPOOL_SAVE_HISTORIES=1 (see tests/replay.py)")  # fmt: skip
    latest = saved[-1]
    kinds = {path.stem.split("-")[0] for path in latest.glob("*.json")}
    assert LONG_RUNNING <= kinds, (f"{latest.name} has no history of {', '.join(sorted(LONG_RUNNING - kinds))}: "
                                   "record them with TIDEPOOL_SAVE_HISTORIES=1 (see tests/replay.py)")  # fmt: skip
