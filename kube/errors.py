"""The error vocabulary: what a Kubernetes API error means for a retry. Activities let `ApiException`s
they do not handle escape; the worker's interceptor (workers/errors.py) turns each into an
`ApplicationError` whose type a user can search for in the Web UI, non-retryable when retrying cannot
help. A 401 stays retryable: clients reload rotated credentials before the next attempt (issue 11).

Messages never quote an object: a 422 says which fields, not their values (the object may be a Secret)."""

from __future__ import annotations

import json
from typing import Any

from kubernetes.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError

# Type names, by HTTP status; the permanent ones fail the activity at once.
PERMANENT: dict[int, str] = {400: "KubernetesBadRequest", 403: "KubernetesForbidden", 405: "KubernetesMethodNotAllowed",
                             413: "KubernetesTooLarge", 422: "KubernetesInvalid"}  # fmt: skip
TEMPORARY: dict[int, str] = {401: "KubernetesUnauthorized", 404: "KubernetesNotFound", 409: "KubernetesConflict",
                             429: "KubernetesTooManyRequests"}  # fmt: skip
# Raised by tidepool itself (kube/clients.py). A credentials Secret that is missing or lacks its key may
# still be written: retryable. One whose kubeconfig does not parse never will: permanent.
MISSING_CREDENTIALS = "MissingCredentials"
INVALID_CREDENTIALS = "InvalidCredentials"
# The token a consumer minted for this provider expired (an outage outlived it): only `tidepool peer`,
# with the consumer's admin credentials, can mint the next. Permanent for the activity; the workflow retries later.
CREDENTIALS_EXPIRED = "CredentialsExpired"


def as_application_error(error: ApiException) -> ApplicationError:
    status = int(error.status or 0)
    body = status_body(error)
    if status in (400, 422):  # both may quote the values they refuse: say which fields only
        causes = (body.get("details") or {}).get("causes") or []
        fields = sorted({str(c.get("field")) for c in causes if c.get("field")})
        detail = f"invalid fields: {', '.join(fields)}" if fields else "invalid"
    else:
        detail = str(body.get("message") or error.reason or "")
    kind = PERMANENT.get(status) or TEMPORARY.get(status) or ("KubernetesUnavailable" if status >= 500 or not status
                                                               else f"Kubernetes{status}")  # fmt: skip
    return ApplicationError(f"Kubernetes API {status}: {detail}"[:1024], type=kind, non_retryable=status in PERMANENT)


def already_exists(error: ApiException) -> bool:
    """Whether a create's error says the object is there. A 409 is not always that: in a namespace with a
    ResourceQuota, quota admission's own update of the quota can lose a race with another write of it, and
    the create answers 409 Conflict with nothing created (2 of 20 pod copies made at once, when the provider
    was re-splitting its offer). Taken for "there already", such a pod is never made."""
    return error.status == 409 and status_body(error).get("reason") == "AlreadyExists"


def status_body(error: ApiException) -> dict[str, Any]:
    """The API server's Status in the error's body; empty when the body is no JSON object."""
    try:
        parsed = json.loads(error.body or "{}")
    except (TypeError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) else {}
