"""The bounded memory every long-running process keeps of what it saw and wrote (models/recent.py,
kube/recent.py): never past its capacity, the entry written longest ago forgotten first."""

from __future__ import annotations

import pytest

from kube.recent import SharedRecent
from models.recent import Recent

pytestmark = [pytest.mark.steady]


@pytest.mark.parametrize("memory", [Recent, SharedRecent])
def test_past_its_capacity_the_entry_written_longest_ago_goes_first(memory: type[Recent[str, int]]) -> None:
    recent = memory(3)
    for i, key in enumerate("abc"):
        recent.put(key, i)
    recent.put("a", 10)  # written again: the newest now
    recent.put("d", 3)
    assert ("b" in recent, recent.get("a"), recent.get("c"), recent.get("d"), len(recent)) == (False, 10, 2, 3, 3)
    assert not recent.add("a", 11) and recent.get("a") == 10  # there already: kept as it was
    assert recent.add("e", 4) and "c" not in recent
    assert recent.pop("a") == 10 and recent.pop("a") is None
    assert recent.take_all() == [3, 4] and len(recent) == 0


def test_a_memory_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity must be at least 1, not 0"):
        Recent(0)

