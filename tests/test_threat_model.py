"""docs/threat-model.md: its tables of what each identity may do are generated (deploy/threatmodel.py) from the
RBAC rules and admission policies the other tests check against real API servers, so the document fails here
when they move without it; README points to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.threatmodel import DOCUMENT, generated_section, render

pytestmark = pytest.mark.deploy


def test_the_threat_model_s_tables_are_those_of_the_rbac_and_policies_tidepool_installs() -> None:
    section = generated_section(DOCUMENT.read_text())
    assert section, f"{DOCUMENT} has lost the markers of its generated section"
    assert section == render(), f"{DOCUMENT} is out of date: run `python -m deploy.threatmodel` and commit it"


def test_the_readme_points_to_the_threat_model() -> None:
    readme = Path(__file__).resolve().parents[1] / "README.md"
    assert "docs/threat-model.md" in readme.read_text()
