"""Status conditions, the Kubernetes convention: one type per question, a closed CamelCase reason, a
message for people, and a lastTransitionTime that moves only when the status does (the activities write
them with kube.objects.with_condition)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from models.api.common import ApiModel

REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


class Condition(ApiModel):
    type: str = Field(min_length=1, max_length=316)
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(min_length=1, max_length=1024, pattern=REASON_PATTERN)
    message: str = Field(default="", max_length=32768)
    last_transition_time: datetime
    observed_generation: int | None = Field(default=None, ge=0)
