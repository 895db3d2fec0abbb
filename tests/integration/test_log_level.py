"""``--log-level`` / ``HOROVOD_LOG_LEVEL`` reach ringtrain's logger in real worker processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from launcher_workers import cli, write_script

_TIMEOUT_S = 180
# Joins, runs one collective through the engine, leaves: every debug line of a short job.
_WORKER = """
import logging, sys
import torch
import ringtrain.torch as hvd
if sys.argv[1:] == ["--configure-logging"]:
    logging.basicConfig(format="APP %(levelname)s %(message)s", level=logging.WARNING)
hvd.init()
assert hvd.allreduce(torch.ones(2), name="x").tolist() == [1.0, 1.0]
hvd.shutdown()
print("done")
"""
# `[rank]<stderr>:` is the launcher's prefix; the rest is the handler init() adds.
_DEBUG_LINE = r"\[{rank}\]<stderr>:\[[^]]* DEBUG ringtrain\.torch\.lifecycle\] rank {rank}{what}"


def _clean_env(**extra: str) -> dict[str, str]:
    # A HOROVOD_* variable exported where the tests run must not decide what they see.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "RINGTRAIN_"))}
    return env | {"OMP_NUM_THREADS": "1"} | extra


def _run(tmp_path, argv: list[str], env: dict[str, str]) -> str:
    script = write_script(tmp_path, "worker.py", _WORKER)
    proc = cli(["-np", "2", *argv, sys.executable, script], tmp_path, env=env)
    try:
        out, err = proc.communicate(timeout=_TIMEOUT_S)
    finally:
        proc.kill()
    assert proc.returncode == 0, f"stdout:\n{out}\nstderr:\n{err}"
    assert out.count("done") == 2
    return err


def test_debug_level_shows_engine_debug_lines_on_every_rank(tmp_path):
    err = _run(tmp_path, ["--log-level", "debug"], _clean_env())
    for rank in range(2):
        assert re.search(_DEBUG_LINE.format(rank=rank, what=" of 2 .*: engine running"), err), err
        assert re.search(_DEBUG_LINE.format(rank=rank, what=": engine stopped"), err), err


def test_without_a_level_no_debug_line(tmp_path):
    err = _run(tmp_path, [], _clean_env())
    assert "DEBUG" not in err and "engine running" not in err, err


def test_an_application_logging_setup_receives_the_lines_once(tmp_path):
    script = write_script(tmp_path, "worker.py", _WORKER)
    proc = subprocess.run([sys.executable, script, "--configure-logging"], cwd=tmp_path,
                          env=_clean_env(HOROVOD_LOG_LEVEL="Debug"), capture_output=True,
                          text=True, timeout=_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "engine running" in line]
    assert len(lines) == 1 and lines[0].startswith("APP DEBUG rank 0 of 1 "), proc.stderr


def test_a_bad_level_fails_init_naming_the_variable(tmp_path):
    script = write_script(tmp_path, "worker.py", _WORKER)
    proc = subprocess.run([sys.executable, script], cwd=tmp_path,
                          env=_clean_env(HOROVOD_LOG_LEVEL="loud"), capture_output=True,
                          text=True, timeout=_TIMEOUT_S)
    assert proc.returncode != 0
    assert "HOROVOD_LOG_LEVEL='loud' is not a level: use one of TRACE, DEBUG" in proc.stderr
