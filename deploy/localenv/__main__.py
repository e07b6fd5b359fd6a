"""`python -m deploy.localenv up|down|status`: the local environment from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from deploy.localenv.env import DEFAULT_STATE_DIR, EnvState, down, up
from deploy.localenv.temporal import TEST_DYNAMIC_CONFIG

DEFAULT_CLUSTERS = ["a", "b", "c", "tenant"]


def print_status(state: EnvState) -> None:
    print(f"Temporal address   {state.temporal_address}")
    print(f"Temporal Web UI    {state.temporal_ui or '(headless)'}")
    print(f"Temporal namespaces {', '.join(state.temporal_namespaces)}")
    for name, path in state.kubeconfigs.items():
        print(f"cluster {name:<10} kubectl --kubeconfig {path} get nodes")
    print(f"state              {state.file}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.localenv", description=__doc__)
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("up", help="start Temporal (with its Web UI) and the clusters")
    start.add_argument("--clusters", default=",".join(DEFAULT_CLUSTERS), help="comma-separated cluster names")
    start.add_argument("--ephemeral", action="store_true",
                       help="Temporal in memory on free ports, with the tests' dynamic config (for test runs)")
    sub.add_parser("down", help="stop everything and remove the state")
    sub.add_parser("status", help="where things are")
    sub.add_parser("env", help="the state as JSON, for scripts")
    args = parser.parse_args(argv)

    if args.command == "up":
        if EnvState.load(args.state_dir):
            print("already up; `down` first to start afresh", file=sys.stderr)
        else:
            up(clusters=[c for c in args.clusters.split(",") if c], state_dir=args.state_dir,
               persistent=not args.ephemeral, dynamic_config=TEST_DYNAMIC_CONFIG if args.ephemeral else None)
        args.command = "status"
    if args.command == "down":
        down(args.state_dir)
        print("down")
        return 0
    state = EnvState.load(args.state_dir)
    if state is None:
        print("not running", file=sys.stderr)
        return 1
    if args.command == "env":
        print(json.dumps(state.__dict__, indent=2))
    else:
        print_status(state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
