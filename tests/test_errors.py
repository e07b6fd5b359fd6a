"""The error vocabulary (kube/errors.py): what a Kubernetes API error means for a retry, and that its
message never quotes the object."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from kubernetes.client.exceptions import ApiException
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import Worker

from kube.errors import already_exists, as_application_error
from workers.errors import KubernetesErrors


def _error(status: int, body: Mapping[str, object]) -> ApiException:
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


@activity.defn(name="read_forbidden")
def _read_forbidden() -> None:
    raise _error(403, {"message": 'secrets "s" is forbidden'})


@workflow.defn(sandboxed=False)  # imports the Kubernetes client at module level, as the test does
class _CallsForbidden:
    @workflow.run
    async def run(self) -> str:
        try:
            await workflow.execute_activity(_read_forbidden, start_to_close_timeout=timedelta(seconds=10),
                                            retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=1)))  # fmt: skip
        except ActivityError as e:
            assert isinstance(e.cause, ApplicationError) and e.retry_state is not None
            return f"{e.cause.type} non_retryable={e.cause.non_retryable} retry_state={e.retry_state.name}"
        return "no error"


@pytest.mark.workflow
async def test_a_worker_fails_a_forbidden_call_at_once_with_its_type(workflow_client: Client) -> None:
    """Through the worker's interceptor: an unlimited retry policy does not retry a 403."""
    queue = f"errors-{uuid.uuid4().hex[:8]}"
    with ThreadPoolExecutor(2) as executor:
        async with Worker(workflow_client, task_queue=queue, workflows=[_CallsForbidden], activities=[_read_forbidden],
                          activity_executor=executor, interceptors=[KubernetesErrors()]):  # fmt: skip
            result = await workflow_client.execute_workflow(_CallsForbidden.run, id=queue, task_queue=queue)
    assert result == "KubernetesForbidden non_retryable=True retry_state=NON_RETRYABLE_FAILURE"


def test_a_create_conflict_is_not_taken_for_an_object_already_there() -> None:
    # The two 409s a create gets, as the API server words them (the first seen in offload_scale's audit log:
    # quota admission lost a race on the namespace's ResourceQuota, and the pod was not created).
    conflict = _error(409, {"kind": "Status", "status": "Failure", "reason": "Conflict", "code": 409,
                            "details": {"name": "tidepool-offer", "kind": "resourcequotas"},
                            "message": 'Operation cannot be fulfilled on resourcequotas "tidepool-offer": the object '
                                       "has been modified; please apply your changes to the latest version and try again"})  # fmt: skip
    exists = _error(409, {"kind": "Status", "status": "Failure", "reason": "AlreadyExists", "code": 409,
                          "details": {"name": "web", "kind": "pods"}, "message": 'pods "web" already exists'})  # fmt: skip
    assert already_exists(exists)
    assert not already_exists(conflict)
    assert not already_exists(_error(404, {"reason": "AlreadyExists"}))  # only a 409 says so
    unreadable = ApiException(status=409, reason="Conflict")
    unreadable.body = "<html>proxy error</html>"
    assert not already_exists(unreadable)
