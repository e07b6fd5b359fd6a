"""The worker's activity interceptor: an unhandled Kubernetes API error leaves an activity as an
`ApplicationError` of the vocabulary in kube/errors.py (a 403 is permanent and fails at once; a timeout,
a 409 or a 5xx is retried by the call site's policy)."""

from __future__ import annotations

from typing import Any

from kubernetes.client.exceptions import ApiException
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from kube.errors import as_application_error


class KubernetesErrors(Interceptor):
    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next)


class _Inbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await self.next.execute_activity(input)
        except ApiException as e:
            raise as_application_error(e) from None  # the cause would carry the response body
