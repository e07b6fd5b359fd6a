"""STYLE.md's strict typing, enforced: mypy --strict over the files [tool.mypy] in pyproject.toml lists."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_strict_finds_no_error() -> None:
    mypy = Path(sys.executable).with_name("mypy")
    # The incremental cache (.mypy_cache, ignored by git) turns a minute's cold run into seconds.
    result = subprocess.run([str(mypy)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("Success: no issues found"), result.stdout


def test_mypy_checks_every_package_and_the_tests_strictly() -> None:
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    packages = settings["importlinter"]["root_packages"]
    assert settings["mypy"]["strict"] is True
    assert sorted(settings["mypy"]["files"]) == sorted([*packages, "tests"])
