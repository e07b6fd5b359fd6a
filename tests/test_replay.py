"""Histories saved from real runs (tests/histories/) replay with the current workflow code: a change
that would break a running workflow on deploy fails here."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory

from tests.replay import HISTORIES, replayer

SAVED = sorted(HISTORIES.glob("*.json"))


@pytest.mark.parametrize("path", SAVED, ids=[p.stem for p in SAVED])
async def test_a_saved_history_replays_with_the_current_code(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    await replayer().replay_workflow(history)


def test_saved_histories_exist_for_every_long_running_workflow() -> None:
    kinds = {path.stem.split("-")[0] for path in SAVED}
    assert {"peering", "admission", "advertisement", "pool"} <= kinds, (
        "save histories with TIDEPOOL_SAVE_HISTORIES=1 (see tests/replay.py)"
    )
