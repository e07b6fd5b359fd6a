"""PodCIDR remapping: no remapping when nothing of ours overlaps (our PodCIDR, Service CIDRs, nodes'
addresses), the first free block when something does; a PodCIDR no pod can have is never decided on."""

from __future__ import annotations

from typing import Any

import pytest

from models.network import NO_REMAPPING, RemapError, remap_pod_cidr
from workers.network import _effective_cidr, _needs_decision

pytestmark = pytest.mark.consumer


@pytest.mark.parametrize(
    ("advertised", "local", "taken", "expected"),
    [
        pytest.param("10.1.0.0/16", ["10.0.0.0/16"], [], NO_REMAPPING, id="a disjoint PodCIDR is kept"),
        pytest.param("10.0.0.0/16", ["10.0.0.0/16"], [], "100.64.0.0/16", id="an overlapping one gets the first free block"),
        pytest.param("10.0.0.0/16", ["10.0.0.0/16"], ["100.64.0.0/16", NO_REMAPPING], "100.65.0.0/16",
                     id="blocks already handed out are skipped"),
        pytest.param("10.0.0.0/24", ["10.0.0.0/8"], [], "100.64.0.0/24", id="the block has the advertised size"),
        pytest.param("10.96.0.0/12", ["10.0.0.0/16", "10.96.0.0/12", "192.168.1.5"], [], "100.64.0.0/12",
                     id="our Service CIDR advertised as a PodCIDR is remapped: our kubernetes Service is not reachable"),
        pytest.param("10.96.0.0/16", ["10.0.0.0/16", "10.96.0.0/12"], [], "100.64.0.0/16",
                     id="a block inside our Service CIDR is remapped"),
        pytest.param("192.168.0.0/16", ["10.0.0.0/16", "10.96.0.0/12", "192.168.1.5"], [], "100.64.0.0/16",
                     id="a block holding one of our nodes' addresses is remapped"),
        pytest.param("fd00::/48", ["10.0.0.0/16", "fd00::1"], [], None, id="an IPv6 block holding our node cannot move"),
        pytest.param("fd01::/48", ["10.0.0.0/16", "fd00::1"], [], NO_REMAPPING, id="a disjoint IPv6 block is kept"),
    ],
)  # fmt: skip
def test_remapping(advertised: str, local: list[str], taken: list[str], expected: str | None) -> None:
    if expected is None:
        with pytest.raises(RemapError, match="cannot be remapped"):
            remap_pod_cidr(advertised, local=local, taken=taken)
    else:
        assert remap_pod_cidr(advertised, local=local, taken=taken) == expected


@pytest.mark.parametrize(
    ("advertised", "message"),
    [
        pytest.param("10.0.0.1/16", "is not a CIDR", id="host bits set is refused"),
        pytest.param("banana", "is not a CIDR", id="garbage is refused"),
        pytest.param("10.0.0.0/8", "cannot be remapped", id="a block larger than the pool cannot move"),
        pytest.param("127.0.0.0/8", "(loopback)", id="a loopback block is never decided on, even if admitted"),
        pytest.param("169.254.0.0/16", "(link-local)", id="a link-local block is never decided on"),
        pytest.param("0.0.0.0/0", "(unspecified)", id="every address at once is never decided on"),
    ],
)
def test_unusable_cidrs_are_refused_with_a_reason(advertised: str, message: str) -> None:
    with pytest.raises(RemapError, match=message):
        remap_pod_cidr(advertised, local=["0.0.0.0/0"], taken=[])


def advertisement(podcidr: str, **status: str) -> dict[str, Any]:
    return {"metadata": {"name": "advertisement-p"}, "spec": {"network": {"podCIDR": podcidr}},
            "status": {"phase": "Accepted", **status}}  # fmt: skip


@pytest.mark.parametrize(
    ("obj", "needed"),
    [
        pytest.param(advertisement("10.1.0.0/16"), True, id="an accepted one without a remapping is decided on"),
        pytest.param(advertisement("10.1.0.0/16", remoteRemappedPodCIDR=NO_REMAPPING, remappedForPodCIDR="10.1.0.0/16"),
                     False, id="one decided for its PodCIDR is left alone"),
        pytest.param(advertisement("10.2.0.0/16", remoteRemappedPodCIDR=NO_REMAPPING, remappedForPodCIDR="10.1.0.0/16"),
                     True, id="one whose PodCIDR changed since the decision is decided on again"),
        pytest.param(advertisement("10.1.0.0/16", remoteRemappedPodCIDR=NO_REMAPPING), True,
                     id="a remapping that does not say what it was decided for is decided on again"),
        pytest.param({**advertisement("10.1.0.0/16"), "status": {"phase": "Pending"}}, False,
                     id="one not accepted is not decided on"),
    ],
)  # fmt: skip
def test_a_decision_holds_for_the_pod_cidr_it_was_made_for(obj: dict[str, Any], needed: bool) -> None:
    assert _needs_decision(obj) is needed


@pytest.mark.parametrize(
    ("obj", "effective"),
    [
        pytest.param(advertisement("10.1.0.0/16", remoteRemappedPodCIDR="100.64.0.0/16", remappedForPodCIDR="10.1.0.0/16"),
                     "100.64.0.0/16", id="a remapped provider takes its block"),
        pytest.param(advertisement("10.2.0.0/16", remoteRemappedPodCIDR=NO_REMAPPING, remappedForPodCIDR="10.1.0.0/16"),
                     "10.1.0.0/16", id="one kept as it is takes the PodCIDR decided for, not its edited spec"),
        pytest.param(advertisement("10.1.0.0/16"), "", id="an undecided one takes nothing"),
    ],
)  # fmt: skip
def test_the_block_a_provider_takes(obj: dict[str, Any], effective: str) -> None:
    assert _effective_cidr(obj) == effective
