"""kube.objects.finalizers_after: the one way tidepool adds and removes its finalizers."""

from __future__ import annotations

from kube.objects import finalizers_after


def test_a_finalizer_is_added_last_removed_wherever_it_is_and_an_unchanged_list_writes_nothing() -> None:
    assert finalizers_after(None, "ours", present=True) == ["ours"]
    assert finalizers_after(["theirs"], "ours", present=True) == ["theirs", "ours"]
    assert finalizers_after(["theirs", "ours"], "ours", present=True) is None
    assert finalizers_after(["ours", "theirs"], "ours", present=False) == ["theirs"]
    assert finalizers_after(["theirs"], "ours", present=False) is None
    assert finalizers_after(None, "ours", present=False) is None
    assert finalizers_after(["ours", "theirs"], "ours", present=True) is None  # where it is: no write to move it
