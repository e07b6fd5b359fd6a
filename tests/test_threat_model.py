"""docs/threat-model.md: its tables of what each identity may do are generated (deploy/threatmodel.py) from the
RBAC rules and admission policies the other tests check against real API servers, so the document fails here
when they move without it; README and the security page point to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.threatmodel import DOCUMENT, generated_section, render

pytestmark = pytest.mark.deploy


def test_the_threat_model_s_tables_are_those_of_the_rbac_and_policies_tidepool_installs() -> None:
    section = generated_section(DOCUMENT.read_text())
    assert section, f"{DOCUMENT} has lost the markers of its generated section"
    assert section == render(), f"{DOCUMENT} is out of date: run `python -m deploy.threatmodel` and commit it"


def test_the_readme_and_the_security_page_point_to_the_threat_model() -> None:
    root = Path(__file__).resolve().parents[1]
    assert "(docs/threat-model.md)" in (root / "README.md").read_text()
    assert "(threat-model.md)" in (root / "docs" / "security.md").read_text()
