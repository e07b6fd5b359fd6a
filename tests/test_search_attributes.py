"""The workflows' search attribute keys and what the namespaces register (models/names.py) name the same
attributes with the same types: an attribute set but not registered fails the workflow task for ever."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from temporalio.common import SearchAttributeIndexedValueType

from models.names import SEARCH_ATTRIBUTES
from workflows.search_attributes import ALL


def test_every_key_a_workflow_sets_is_registered_with_its_type() -> None:
    kinds = {SearchAttributeIndexedValueType.KEYWORD: "Keyword", SearchAttributeIndexedValueType.INT: "Int",
             SearchAttributeIndexedValueType.KEYWORD_LIST: "KeywordList"}  # fmt: skip
    assert {key.name: kinds[key.indexed_value_type] for key in ALL} == SEARCH_ATTRIBUTES


def test_the_production_instructions_register_every_attribute_and_upgrades_do_not_overlap() -> None:
    root = Path(__file__).resolve().parents[1]
    instructions = (root / "docs" / "deployment.md").read_text()
    registered = dict(re.findall(r"\b(\w+)=(Keyword|Int|KeywordList)\b", instructions))
    assert registered == SEARCH_ATTRIBUTES
    documents = yaml.safe_load_all((root / "deploy/base/deployment.yaml").read_text())
    worker = next(d for d in documents if d and d["kind"] == "Deployment")
    assert worker["spec"]["strategy"] == {"type": "Recreate"}
