"""`python -m bench <name> [--param value ...]`, or `python -m bench all` (all but the soak). Parameters are each
benchmark's DEFAULTS, given as `--name value` (e.g. `--changes 50`); the figures go to stdout as JSON
lines, progress to stderr."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from typing import Any

from bench import common

# In the order `all` runs them: cheap and pure first, the heavy API-server one last.
BENCHMARKS = (
    "pool_placement",
    "push_latency",
    "actions_per_day",
    "versioning",
    "offload_latency",
    "offload_scale",
    "pool_failover",
    "pool_sync_scale",
    "peering_scale",
    "resource_compute",
)
# Run only by name: the soak runs in real time (45 minutes by default).
ON_DEMAND = ("soak",)


def _params(name: str, overrides: list[str]) -> dict[str, Any]:
    defaults: dict[str, Any] = importlib.import_module(f"bench.{name}").DEFAULTS
    parser = argparse.ArgumentParser(prog=f"python -m bench {name}")
    for key, value in defaults.items():
        parser.add_argument(f"--{key.replace('_', '-')}", dest=key, type=type(value), default=value)
    return vars(parser.parse_args(overrides))


def _exit_on_sigterm(signum: int, frame: object) -> None:
    sys.exit(128 + signum)  # unwinds like Ctrl-C, so each benchmark tears its environment down


def main(argv: list[str] | None = None) -> None:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    # Only the figures on stdout: the Temporal core writes its log lines to file descriptor 1.
    common.figures_out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("name", choices=[*BENCHMARKS, *ON_DEMAND, "all"])
    args, rest = parser.parse_known_args(argv)
    for name in BENCHMARKS if args.name == "all" else (args.name,):
        params = _params(name, rest if args.name != "all" else [])
        importlib.import_module(f"bench.{name}").run(params)


if __name__ == "__main__":
    main()
