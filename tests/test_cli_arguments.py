"""`tidepool explain`, `tidepool simulate` and `tidepool unpeer` refuse bad arguments with the argument and the
rule, before reaching Temporal or a cluster (exit 2), and a kubeconfig that cannot be read before Temporal
(exit 1)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.explain


def _tidepool(*args: str) -> subprocess.CompletedProcess[str]:
    # An address nothing listens on: a command that got past its arguments would fail on it, not hang.
    return subprocess.run([sys.executable, "-m", "workers.cli", *args, "--temporal-address", "127.0.0.1:1"],
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})  # fmt: skip


@pytest.mark.parametrize(("args", "said"), [
    (["simulate", "admission", "--max", "-1", "--cluster-id", "b"], "argument --max: '-1': maxAcceptableAdvertisements is a whole number from 0 to 1000000"),
    (["simulate", "admission", "--max", "3"], "simulate admission: --cluster-id is required (or set TIDEPOOL_CLUSTER_CLUSTER_ID)"),
    (["simulate", "admission", "--max", "3", "--cluster-id", "B"], "--cluster-id 'B' is not a cluster id"),
    (["simulate", "peering", "a", "--sharing-percentage", "101", "--cluster-id", "b"], "'101': a sharing percentage is a whole number from 0 to 100"),
    (["simulate", "peering", "a", "--sharing-percentage", "50", "--cluster-id", "b", "--since", "yesterday"], "'yesterday' is neither a duration"),
    (["explain", "pod", "shop/web", "--kubeconfig", "cons.yaml"], "explain pod: --cluster-id is required"),
    (["explain", "pod", "shop", "--kubeconfig", "cons.yaml", "--cluster-id", "b"], "NAME must be NAMESPACE/POD"),
    (["simulate", "pool", "--policy", "binpack"], "argument --policy: invalid choice: 'binpack'"),
    (["simulate", "pool", "--policy", "pack", "--workflow-id", "a'b"], "--workflow-id \"a'b\" must not contain quotes"),
    (["explain", "namespace", "shop", "--tenant", "Blue"], "explain namespace: --tenant 'Blue' is not a Tenant's name: its metadata.name must be a DNS label"),
    (["explain", "pod", "shop/web", "--tenant", "a/b"], "--tenant 'a/b' is not a Tenant's name"),
    (["explain", "peering", "a", "--cluster-id", "b", "--tenant", "blue"], "explain peering: --tenant names a pool's tenant: it is for `explain namespace` and `explain pod` of the pool"),
])  # fmt: skip
def test_bad_arguments_name_the_argument_and_the_rule(args: list[str], said: str) -> None:
    done = _tidepool(*args)
    assert (done.returncode, said in done.stderr) == (2, True), done.stderr


def test_a_kubeconfig_that_cannot_be_read_is_said_before_temporal_is_called() -> None:
    done = _tidepool("explain", "pod", "shop/web", "--kubeconfig", "/nonexistent/cons.yaml", "--cluster-id", "b")
    assert done.returncode == 1
    assert done.stderr.startswith("tidepool explain: --kubeconfig /nonexistent/cons.yaml: Invalid kube-config file"), done.stderr


UNPEER_SIDES = "unpeer: give either --provider and --consumer-id (on the provider) or --consumer and --provider-id (on the consumer)"


@pytest.mark.parametrize("args", [
    ["--consumer", "b.yaml"], ["--provider", "a.yaml", "--provider-id", "a"], [],
    ["--provider", "a.yaml", "--consumer-id", "b", "--consumer", "b.yaml", "--provider-id", "a"],
])  # fmt: skip
def test_unpeer_is_told_which_side_it_runs_on(args: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "workers.cli", "unpeer", *args, "--force"], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    assert (done.returncode, UNPEER_SIDES in done.stderr) == (2, True), done.stderr
