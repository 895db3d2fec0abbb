"""The service's side of object storage: checking a spec's store URLs and secrets at submit,
and writing an attempt's plan for the storage steps of its nodes (docs/storage.md).

The plan is the one place credentials leave the secrets folder: a file of mode 600 in a folder
of mode 700 of the service's home (outside every job's folder), read by the node's stager and
uploader and removed when the attempt ends.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ringtrain.jobs.models import JobInfo, JobSpec
from ringtrain.jobs.models.spec import InputSource
from ringtrain.storage import transfers
from ringtrain.storage.locations import url_problem
from ringtrain.storage.secrets import SecretError, SecretStore

#: The node cache's default bound.
DEFAULT_CACHE_GB = 100.0


@dataclass(frozen=True)
class StorageSettings:
    """Where the secrets, the node cache and the plans are, and how transfers run."""

    secrets: SecretStore
    cache_root: Path
    plans_folder: Path
    cache_max_bytes: int = int(DEFAULT_CACHE_GB * 1e9)
    concurrency: int = transfers.DEFAULT_CONCURRENCY
    stall_s: float = transfers.DEFAULT_STALL_S

    def spec_problems(self, spec: JobSpec) -> list[dict[str, str]]:
        """The store URLs of ``spec`` this host cannot read, and the secrets it lacks."""
        errors = []
        for name, source in spec.input_sources().items():
            problem = url_problem(source.url) if source.mode == "copy" else None
            problem = problem or self._secret_problem(source.secret)
            if problem:
                errors.append({"field": f"inputs.{name}", "message": problem})
        if spec.outputs_url:
            problem = url_problem(spec.outputs_url) or self._secret_problem(spec.outputs_secret)
            if problem:
                errors.append({"field": "outputs_url", "message": problem})
        return errors

    def _secret_problem(self, name: str | None) -> str | None:
        if name is None:
            return None
        try:
            self.secrets.get(name)
        except SecretError as e:
            return str(e)
        return None

    def write_plan(self, job: JobInfo) -> str | None:
        """Write the plan of ``job``'s attempt; its path, or None when it has no storage step."""
        spec = job.spec
        copies = {n: s for n, s in spec.input_sources().items() if s.mode == "copy"}
        outputs = spec.outputs_location(job.id)
        if not copies and not outputs:
            return None
        plan: dict[str, Any] = {
            "cache_root": str(self.cache_root), "cache_max_bytes": self.cache_max_bytes,
            "concurrency": self.concurrency, "stall_s": self.stall_s,
            "holder": f"{job.id}.{job.attempt}",
            "inputs": {name: {"url": s.url, "options": self._options(s)}
                       for name, s in copies.items()}}
        if outputs:
            folder = Path(job.job_dir)
            plan["outputs"] = {
                "url": outputs, "folder": str(folder / "outputs"),
                "journal": str(folder / "launcher" / "uploaded.jsonl"),
                "options": self.secrets.get(spec.outputs_secret) if spec.outputs_secret else {}}
        self.plans_folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.plans_folder, 0o700)
        path = self.plans_folder / f"{job.id}.{job.attempt}.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(plan, f)
        return str(path)

    def remove_plan(self, job: JobInfo) -> None:
        """Remove the plan of ``job``'s current attempt, if it is still there."""
        (self.plans_folder / f"{job.id}.{job.attempt}.json").unlink(missing_ok=True)

    def _options(self, source: InputSource) -> dict[str, str]:
        options = dict(self.secrets.get(source.secret)) if source.secret else {}
        if source.endpoint_url:
            options["endpoint_url"] = source.endpoint_url
        return options
