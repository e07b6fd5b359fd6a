"""Benchmarks: `python -m bench <name>` runs one on the local environment and prints one JSON line per
figure; `python -m bench all` runs them all. Nothing in tidepool imports this package."""
