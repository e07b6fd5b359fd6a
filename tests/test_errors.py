"""The error vocabulary (kube/errors.py): what a Kubernetes API error means for a retry, and that its
message never quotes the object."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException

from kube.errors import as_application_error


def _error(status: int, body: dict[str, object]) -> ApiException:
    e = ApiException(status=status, reason="x")
    e.body = json.dumps(body)
    return e


@pytest.mark.parametrize(("status", "kind", "permanent"), [
    (403, "KubernetesForbidden", True), (422, "KubernetesInvalid", True), (400, "KubernetesBadRequest", True),
    (401, "KubernetesUnauthorized", False), (409, "KubernetesConflict", False), (404, "KubernetesNotFound", False),
    (429, "KubernetesTooManyRequests", False), (500, "KubernetesUnavailable", False), (503, "KubernetesUnavailable", False),
])  # fmt: skip
def test_a_status_maps_to_a_searchable_type_and_its_retry(status: int, kind: str, permanent: bool) -> None:
    error = as_application_error(_error(status, {"message": "m"}))
    assert (error.type, error.non_retryable) == (kind, permanent)


def test_a_forbidden_call_says_what_the_api_server_said() -> None:
    message = 'secrets "s" is forbidden: User "u" cannot get resource "secrets" in the namespace "n"'
    assert message in str(as_application_error(_error(403, {"message": message})))


def test_an_invalid_object_names_its_fields_never_their_values() -> None:
    body = {"message": 'Secret "s" is invalid: data[token]: Invalid value: "hunter2-token"',
            "details": {"causes": [{"field": "data[token]", "message": 'Invalid value: "hunter2-token"'}]}}
    error = str(as_application_error(_error(422, body)))
    assert "data[token]" in error and "hunter2" not in error
