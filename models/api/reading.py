"""Reading objects another cluster (or a person) wrote through the models that generate the CRDs, leniently:
the model's ValidationError becomes a list of sentences, each naming the field (as the object writes it) and
the rule, and nothing raises, whatever the input. Used by models/admission.py for the Advertisements providers
write; the rules themselves are the models' (field types and validators), stated once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from models.api.common import CIDR_PATTERN, DNS_LABEL, KubernetesObject

K = TypeVar("K", bound=KubernetesObject)

# What a pattern of the models means, as a problem says it (the CRD keeps the pattern itself).
PATTERN_RULES: Final[Mapping[str, str]] = {
    DNS_LABEL: "must be a DNS-1123 label (lower-case alphanumerics and '-', at most 63 characters)",
    CIDR_PATTERN: "must be a CIDR such as 10.1.0.0/16",
}
MAX_SENTENCE: Final = 256
_OBJECT_TYPES: Final = frozenset({"dict_type", "model_type", "model_attributes_type"})
_SCALAR_TYPES: Final[Mapping[str, str]] = {"string_type": "a string", "list_type": "a list", "int_type": "an integer",
                                           "bool_type": "a boolean"}  # fmt: skip


@dataclass(frozen=True)
class Problem:
    path: tuple[str, ...]  # where, by the names the object is written with: ("spec", "resourceQuota", "hard", "cpu")
    sentence: str  # naming the path and the rule: "spec.resourceQuota.hard.cpu must not be negative, got -2"


@dataclass(frozen=True)
class Reading(Generic[K]):
    """An object as read: its model when it holds, else None, and every problem found."""

    raw: Any = field(repr=False)
    model: K | None
    problems: tuple[Problem, ...]

    @property
    def sentences(self) -> list[str]:
        return [p.sentence for p in self.problems]

    def unsound(self, *path: str) -> bool:
        """Whether the model found a problem at `path` (or inside it), or a part holding it is no object."""
        if any(p.path[:len(path)] == path for p in self.problems):
            return True
        value = self.raw
        for key in path[:-1]:
            if not isinstance(value, Mapping):
                return True
            value = value.get(key)
        return not isinstance(value, Mapping)

    def sound(self, *path: str) -> Any:
        """The value at `path` as written, when it is not `unsound` (None otherwise, or when absent): what the
        model would hold there, for the checks across fields that must not wait for the whole object to be valid
        (every problem is named at once)."""
        if self.unsound(*path):
            return None
        value = self.raw
        for key in path:
            value = value.get(key)
        return value


def read_leniently(kind: type[K], raw: Any) -> Reading[K]:
    """`raw` read by `kind`'s model, by the names the API writes (never the Python ones), without raising."""
    if not isinstance(raw, Mapping):
        return Reading(raw=raw, model=None, problems=(Problem((), f"the {kind.KIND} must be an object, got "
                                                                f"{type(raw).__name__}"),))  # fmt: skip
    try:
        model = kind.model_validate({"kind": kind.KIND, **raw}, by_alias=True, by_name=False)
    except ValidationError as error:
        problems = tuple(_problem(e, kind.KIND) for e in error.errors(include_url=False))
        return Reading(raw=raw, model=None, problems=problems)
    return Reading(raw=raw, model=model, problems=())


def _problem(error: ErrorDetails, kind: str) -> Problem:
    """The error as a sentence, at most MAX_SENTENCE characters: a value is quoted short, and a validator's message
    cut short (it may quote a long value whole)."""
    path, sentence = _sentence(error, kind)
    return Problem(path, sentence if len(sentence) <= MAX_SENTENCE else sentence[:MAX_SENTENCE - 3] + "...")


def _sentence(error: ErrorDetails, kind: str) -> tuple[tuple[str, ...], str]:
    path = tuple(str(part) for part in error["loc"])
    where = ".".join(path) or f"the {kind}"
    code, value, context = error["type"], error.get("input"), error.get("ctx") or {}
    if code == "missing" or value is None:  # a null is no value (a merge patch's null deletes the field)
        rule = "is missing"
    elif code == "string_too_short" and value == "":
        rule = "must not be empty"
    elif code in _OBJECT_TYPES:
        rule = f"must be an object, got {type(value).__name__}"
    elif code in _SCALAR_TYPES:
        rule = f"must be {_SCALAR_TYPES[code]}, got {type(value).__name__}"
    elif code == "string_pattern_mismatch":
        pattern = str(context.get("pattern"))
        rule = f"{_shown(value)} {PATTERN_RULES.get(pattern, f'must match {pattern}')}"
    elif code == "string_too_long":
        rule = f"must be at most {context.get('max_length')} characters long"
    elif code == "extra_forbidden":
        rule = "is not a known field"
    elif code == "value_error":  # the models' own validators: their message is the rule
        message = str(context.get("error") or error["msg"])
        if message.startswith(where):
            return path, message
        return path, f"{where} {message}" if message.startswith(("must ", "is ")) else f"{where}: {message}"
    else:
        rule = f"is not valid ({error['msg']}), got {_shown(value)}"
    return path, f"{where} {rule}"


def _shown(value: Any) -> str:
    """A value as a problem quotes it: short, and never raising (the repr of a huge int does)."""
    try:
        text = repr(value)
    except ValueError:
        return f"{type(value).__name__} too long to show"
    return text if len(text) <= 64 else text[:61] + "..."
