"""The committed CRDs are what the models generate, and they are structural schemas."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from deploy.crdgen import CRD_DIR, main, render

pytestmark = pytest.mark.api


def test_the_committed_crds_equal_a_fresh_generation() -> None:
    assert main(["--check"]) == 0, "run `python -m deploy.crdgen` and commit deploy/crds"


def _walk(node: Any, path: str = "") -> list[str]:
    problems = []
    if isinstance(node, dict):
        for key in ("$ref", "$defs", "title"):
            if key in node:
                problems.append(f"{path}: {key}")
        if "properties" in node and "additionalProperties" in node:
            problems.append(f"{path}: properties with additionalProperties")
        for option in node.get("anyOf", []):
            if option == {"type": "null"}:
                problems.append(f"{path}: anyOf with null")
        for key, value in node.items():
            problems += _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            problems += _walk(item, f"{path}[{i}]")
    return problems


@pytest.mark.parametrize("path", sorted(render()), ids=lambda p: p.name)
def test_each_crd_is_a_structural_schema(path: Any) -> None:
    crd = yaml.safe_load(render()[path])
    assert _walk(crd["spec"]["versions"][0]["schema"]) == []
    namespaced = {"NamespaceOffloading", "RemoteNamespace"}  # one per namespace, and one per consumer's request
    assert crd["spec"]["scope"] == ("Namespaced" if crd["spec"]["names"]["kind"] in namespaced else "Cluster")
    assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}
    assert path.parent == CRD_DIR
