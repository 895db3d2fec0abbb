"""Changes to a job spec given at submit time: ``--set KEY=VALUE`` and ``--args "..."``.

They are applied to the spec file's fields before validation, so the job records the spec as
submitted (``job show -o json`` shows the changed values) and a bad value is refused naming
its field, as in a file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from ringtrain.jobs.errors import SpecError
from ringtrain.jobs.models.spec import JobSpec, parse_job_spec

#: Mapping fields whose keys a ``--set`` may name after a dot (``environment.SEED=1``).
MAPPING_FIELDS = ("environment", "inputs")


def apply_overrides(spec: JobSpec, sets: Sequence[str] = (), args: str | None = None,
                    source: str = "job spec") -> JobSpec:
    """``spec`` with each ``KEY=VALUE`` of ``sets`` set, then ``args`` appended to its command.

    A value is read as YAML (``node_count=2`` is a number, ``outputs=[model]`` a list, ``''``
    empty); ``KEY`` is a field of the spec, or ``environment.NAME`` / ``inputs.NAME``.

    Raises:
        SpecError: an item without ``=``, an unknown field, or a value the field refuses.
    """
    data: dict[str, Any] = spec.model_dump(mode="json", exclude_unset=True)
    errors = []
    for item in sets:
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or not key:
            errors.append({"field": "--set", "message": f"{item!r} is not KEY=VALUE"})
            continue
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        head, dot, name = key.partition(".")
        if dot and head in MAPPING_FIELDS and name:
            data[head] = {**data.get(head, {}), name: value}
        elif dot or key not in JobSpec.model_fields:
            errors.append({"field": key, "message": "not a field of a job spec (see `ringtrain "
                                                    "job schema`; environment.NAME and "
                                                    "inputs.NAME set one entry)"})
        else:
            data[key] = value
    if errors:
        raise SpecError(errors, source)
    if args:
        data["command"] = f"{data['command']} {args}"
    return parse_job_spec(data, source)
