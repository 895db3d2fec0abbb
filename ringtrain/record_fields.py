"""The fields of a record one process wrote for another, checked one way.

``ringtrain run``'s result and world files (:mod:`ringtrain.run_files`), the job runner's launch
and status files and launch handles (``ringtrain.jobs.service.executors``) are JSON objects; the
worker env contract (:mod:`ringtrain.contract.env`) is a map of strings. A reader of any of them
asks for a field by name and type, and gets the value, its default when the field is absent, or
a :class:`FieldError` that names the field and says what was wrong. The caller adds which
record it was (a file name, "environment variable").

A leaf: standard library only, so the launcher, its workers and the job runner all import it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")

#: The default of a field that must be there.
REQUIRED: Any = object()


class FieldError(ValueError):
    """A record is not JSON, lacks a field, or has one of the wrong type or form."""


def parse_json(text: str | bytes) -> Any:
    """The JSON value of a record's text.

    Raises:
        FieldError: it is not JSON.
    """
    try:
        return json.loads(text)
    except ValueError as e:
        raise FieldError(f"not valid JSON ({e})") from None


def json_object(data: Any) -> Mapping[str, Any]:
    """``data`` if it is a JSON object.

    Raises:
        FieldError: it is not.
    """
    if not isinstance(data, Mapping):
        raise FieldError(f"must be a JSON object, not {type(data).__name__}")
    return data


def field(data: Mapping[str, Any], key: str, kinds: type | tuple[type, ...],
          default: Any = REQUIRED) -> Any:
    """``data[key]`` if it has one of ``kinds``; ``default`` if absent (when there is one).

    Raises:
        FieldError: the field is absent and required, or of another type.
    """
    if key not in data:
        if default is REQUIRED:
            raise FieldError(f"lacks the field {key!r}")
        return default
    value = data[key]
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    # JSON's true and false are ints to isinstance, but never a pid, a rank or a count.
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        wanted = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise FieldError(f"field {key!r} must be {wanted}, not {value!r}")
    return value


def items(data: Mapping[str, Any], key: str, kind: type) -> tuple[Any, ...]:
    """``data[key]`` as a tuple, if it is a list of ``kind``.

    Raises:
        FieldError: the field is absent, not a list, or holds something else.
    """
    value = field(data, key, list)
    if not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
        raise FieldError(f"field {key!r} must be a list of {kind.__name__}, not {value!r}")
    return tuple(value)


def text_field(data: Mapping[str, str], key: str, convert: Callable[[str], T], kind: str,
               default: Any = REQUIRED) -> T:
    """The string ``data[key]`` of a map of strings (an environment), stripped of blanks and
    converted by ``convert`` (which raises ``ValueError`` on a bad one); ``default`` if absent or
    blank (:data:`REQUIRED`: there is none).

    Raises:
        FieldError: the field is absent and required ("is required but not set"), or
            ``convert`` refused it (the message says it is not ``kind``, "an integer").
    """
    raw = data.get(key)
    if raw is None or raw.strip() == "":
        if default is REQUIRED:
            raise FieldError(f"{key} is required but not set")
        return default
    try:
        return convert(raw.strip())
    except ValueError:
        raise FieldError(f"{key}={raw!r} is not {kind}") from None
