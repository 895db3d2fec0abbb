"""A local attempt's storage steps: stage the inputs from their URLs before the preparation,
upload the outputs as they settle while the ranks run and all of them at the end.

Each step is ``python -m ringtrain.storage.node_main`` in a child process of the job runner
(which stays standard-library only): a stager per node writing its progress into that node's
preparation log, the uploader into the runner's log. The plan file the service wrote (mode
600, outside the job's folder: it holds the stores' credentials) is removed when the attempt
ends, and with it the attempt's holds on the node cache.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from ringtrain.jobs.envvars import input_var
from ringtrain.jobs.job_folder import JobFolder, prep_log_path
from ringtrain.storage.node_cache import NodeCache

_MODULE = "ringtrain.storage.node_main"
#: How long the uploader that watches the outputs may take to finish its file once told to stop.
_WATCH_STOP_S = 60.0


class StorageSteps:
    """The storage steps of one attempt, from the plan at ``plan_path``."""

    def __init__(self, plan_path: str, job_dir: Path, node_count: int):
        self.plan_path = plan_path
        self.plan = json.loads(Path(plan_path).read_text())
        self.folder = JobFolder(job_dir)
        self.node_count = node_count
        self._watch: subprocess.Popen | None = None

    def stage(self) -> tuple[int, str, dict[str, str]]:
        """Stage the copied inputs on every node at once: ``(0, "", variables)`` with each
        input's variable pointing at its local copy, or the first failing node's exit code and
        its error line."""
        if not self.plan.get("inputs"):
            return 0, "", {}
        children = []
        for k in range(self.node_count):
            result = self.folder.root / "launcher" / f"staged-{k}.json"
            with open(self.folder.prep_log(k, "stdout"), "ab") as out:
                children.append((result, out.name, subprocess.Popen(
                    [sys.executable, "-m", _MODULE, "stage", self.plan_path, str(result)],
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)))
        for k, (_, log, child) in enumerate(children):
            if child.wait() != 0:
                return 1, (f"staging inputs failed on node {k}: {_error_line(Path(log))} "
                           f"(see {prep_log_path(k, 'stdout')})"), {}
        staged = json.loads(children[0][0].read_text())
        return 0, "", {input_var(name): path for name, path in staged.items()}

    def start_watch(self) -> None:
        """Upload outputs as they settle, until :meth:`upload_all`."""
        if self.plan.get("outputs"):
            self._watch = subprocess.Popen([sys.executable, "-m", _MODULE, "upload",
                                            self.plan_path, "--watch"],
                                           stdin=subprocess.DEVNULL)

    def upload_all(self, final: bool = True) -> tuple[int, str]:
        """Stop the watcher, then (if ``final``) upload every output not yet stored: ``(0, "")``
        or ``(1, the store's error)``."""
        if self._watch is not None:
            self._watch.send_signal(signal.SIGTERM)
            try:
                self._watch.wait(timeout=_WATCH_STOP_S)
            except subprocess.TimeoutExpired:
                self._watch.kill()
                self._watch.wait()
        if not final or not self.plan.get("outputs"):
            return 0, ""
        run = subprocess.run([sys.executable, "-m", _MODULE, "upload", self.plan_path],
                             stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, check=False)
        text = run.stdout.decode(errors="replace")
        sys.stdout.write(text)
        sys.stdout.flush()
        if run.returncode != 0:
            errors = [line for line in text.splitlines() if line.startswith("error: ")]
            reason = errors[-1][len("error: "):] if errors else f"exit code {run.returncode}"
            return 1, f"uploading the outputs failed ({reason}); they are kept in the job's folder"
        return 0, ""

    def end(self) -> None:
        """Release the attempt's cache holds and remove the plan (its credentials)."""
        cache = self.plan.get("cache_root")
        if cache:
            NodeCache(Path(cache), 0).release(self.plan["holder"])
        try:
            os.unlink(self.plan_path)
        except OSError:
            pass


def _error_line(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return "no output"
    errors = [line[len("error: "):] for line in lines if line.startswith("error: ")]
    return errors[-1] if errors else (lines[-1] if lines else "no output")
