"""Reading a spec file: bounded in size, UTF-8, and YAML whose aliases cannot blow up.

YAML aliases make a tiny file stand for a huge document (``a: &a [x, x]``, ``b: [*a, *a]``, ...,
nine levels make a billion values). The loader counts every value as it would be once aliases are
expanded and refuses the file past :data:`MAX_VALUES`, before anything walks the expanded
document; it also refuses a recursive alias and nesting deeper than :data:`MAX_DEPTH`.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import yaml
from yaml.composer import ComposerError
from yaml.nodes import Node

from ringtrain.jobs.errors import SpecError
from ringtrain.jobs.models.spec import (
    MAX_ENTRIES,
    MAX_SPEC_BYTES,
    JobSpec,
    parse_job_spec,
)

MAX_VALUES = 10_000  # a real spec has a few hundred at most
MAX_DEPTH = 32  # a spec nests three levels


class YAMLLimitError(ComposerError):
    """A YAML document over the loader's bounds (the message says which)."""


class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that bounds the expanded size and the depth of the document."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._values = 0  # nodes of the document with every alias expanded
        self._sizes: dict[str, int] = {}  # expanded size of each completed anchor
        self._depth = 0
        self._aliased = False  # whether any alias was expanded (what the error blames)

    def compose_node(self, parent: Node | None, index: object) -> Node:
        event = self.peek_event()
        if self.check_event(yaml.AliasEvent):
            node = super().compose_node(parent, index)  # refuses undefined aliases
            if event.anchor not in self._sizes:
                raise YAMLLimitError(None, None, f"alias *{event.anchor} refers to itself; a spec "
                                    "cannot contain itself", event.start_mark)
            self._aliased = True
            self._count(self._sizes[event.anchor], event)
            return node
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise YAMLLimitError(None, None, f"values nested deeper than {MAX_DEPTH} levels",
                                event.start_mark)
        before = self._values
        node = super().compose_node(parent, index)
        self._depth -= 1
        self._count(1, event)
        if event.anchor is not None:
            self._sizes[event.anchor] = self._values - before
        return node

    def _count(self, values: int, event: yaml.Event) -> None:
        self._values += values
        if self._values > MAX_VALUES and self._aliased:
            raise YAMLLimitError(None, None, f"more than {MAX_VALUES} values once aliases are "
                                "expanded; write the spec without aliases that repeat so much",
                                event.start_mark)
        if self._values > MAX_VALUES:
            raise YAMLLimitError(None, None, f"more than {MAX_VALUES} values; a spec holds a "
                                "few hundred (outputs, inputs and environment take at most "
                                f"{MAX_ENTRIES} entries each)", event.start_mark)


def load_job_spec(path: str | Path) -> JobSpec:
    """Read and validate a YAML or JSON spec file (``.json`` is parsed as JSON, anything else as
    YAML).

    Raises:
        SpecError: the file is unreadable, larger than :data:`MAX_SPEC_BYTES`, not UTF-8, not
            YAML/JSON, too big once aliases are expanded, or has bad fields.
    """
    path = Path(path)
    source = f"job spec {path}"

    def refuse(message: str) -> SpecError:
        return SpecError([{"field": "(file)", "message": message}], source)

    try:
        # Non-blocking: opening a named pipe would wait for a writer, forever.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise refuse(f"cannot read {path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = "a folder" if stat.S_ISDIR(mode) else "a named pipe, socket or device"
            raise refuse(f"{path} is {what}, not a file: save the spec in a file and name that")
        try:
            raw = f.read(MAX_SPEC_BYTES + 1)
        except OSError as e:
            raise refuse(f"cannot read {path}: {e.strerror}") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise refuse(f"larger than {MAX_SPEC_BYTES >> 20} MiB; a spec names files, it does not "
                     "hold them")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise refuse(f"not UTF-8 text (byte {raw[e.start]:#04x} at offset {e.start}); save it "
                     "as UTF-8") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.load(text, BoundedLoader)
    except YAMLLimitError as e:
        raise refuse(str(e)) from None
    except (yaml.YAMLError, json.JSONDecodeError) as e:
        raise refuse(f"not valid YAML/JSON: {e}") from None
    except RecursionError:
        raise refuse("values nested too deeply") from None
    return parse_job_spec(data, source)
