"""What a caller limited to one experiment sees of the answers about the whole service.

A read or submit token limited to one experiment must not learn other experiments' jobs, not
even their ids: the event stream, the host's usage (by job) and the clusters' nodes (which name
the jobs holding them) are cut down to that experiment's jobs here. Routes about one job are
refused before they run (:mod:`ringtrain.jobs.service.api.scope_guard`); a caller that sees
every experiment gets every answer as it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ringtrain.jobs.service.api.caller import Caller


class StreamView:
    """What one event stream shows its caller, and which jobs it has shown, so that it tells of
    a removed job only if it told of the job.

    Args:
        caller: who reads the stream.
    """

    def __init__(self, caller: Caller):
        self.caller = caller
        self.limited = caller.experiment is not None
        self.shown: set[str] = set()

    def jobs(self, summaries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """The job summaries (``job_summary``) of jobs the caller sees."""
        if not self.limited:
            return list(summaries)
        out = [s for s in summaries if self.caller.sees(s["experiment"])]
        self.shown.update(s["id"] for s in out)
        return out

    def removed(self, ids: Iterable[str]) -> list[str]:
        """The removed jobs' ids the caller was shown."""
        if not self.limited:
            return list(ids)
        out = [i for i in ids if i in self.shown]
        self.shown.difference_update(out)
        return out

    def clusters(self, clusters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The clusters with their nodes, naming only jobs the caller was shown."""
        if not self.limited:
            return clusters
        return [{**c, "nodes": [{**n, "jobs": [j for j in n["jobs"] if j in self.shown]}
                                for n in c["nodes"]]} for c in clusters]

    def host(self, sample: dict[str, Any]) -> dict[str, Any]:
        """A host sample whose per-job usage names only jobs the caller was shown."""
        return usage_of(sample, self.shown) if self.limited else sample


def usage_of(sample: dict[str, Any], visible: set[str]) -> dict[str, Any]:
    """A host sample (``/v1/host``) with the usage of the ``visible`` jobs only."""
    return {**sample, "jobs": {k: v for k, v in sample.get("jobs", {}).items() if k in visible}}
