"""The cap on a job's outputs (issue 22): a job writing past its spec's max_output_files or
max_output_bytes is stopped and fails naming the cap, instead of filling the disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ringtrain.jobs.home import Home
from ringtrain.jobs.models import parse_job_spec
from ringtrain.jobs.service.output_quota import OutputLimits, over_cap

from .conftest import CLI, wait_for
from .test_e2e import spec_file

WRITE_FOREVER = ("python -c \"import os, time, itertools\n"
                 "out = os.environ['RINGTRAIN_OUTPUT_O']\n"
                 "for i in itertools.count():\n"
                 "    open(os.path.join(out, f'f{i}'), 'wb').write(b'x' * 1000)\n"
                 "    time.sleep(0.001)\"")


@pytest.mark.parametrize("cap,says", [
    ({"max_output_files": 200}, "max_output_files=200 files"),
    ({"max_output_bytes": 300_000}, "max_output_bytes=300,000 bytes"),
])
def test_a_job_writing_without_end_fails_naming_its_cap(home: Home, cli: CLI, tmp_path: Path,
                                                        cap: dict[str, int], says: str) -> None:
    assert cli("cluster", "create", "c1", "--nodes", "1")[0] == 0
    spec = spec_file(tmp_path, "writer", node_count=1, command=WRITE_FOREVER, outputs=["o"],
                     max_wall_clock_time=120, **cap)
    rc, out, err = cli("job", "submit", spec, "--cluster", "c1")
    assert rc == 0, err
    job_id = out.strip()

    def failed() -> dict | None:
        job = json.loads(cli("job", "show", job_id, "-o", "json")[1])
        return job if job["state"] == "failed" else None

    job = wait_for(failed, timeout_s=90, every_s=0.5)
    assert says in job["message"], job
    written = len(list((home.share_root / "jobs" / job_id / "outputs" / "o").iterdir()))
    assert written < 20_000  # stopped within seconds of passing the cap, not at the wall clock


def test_over_cap_counts_regular_files_only_and_stops_early(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    for i in range(5):
        (tmp_path / "a" / "b" / f"f{i}").write_bytes(b"x" * 100)
    (tmp_path / "a" / "link").symlink_to("/etc")
    assert over_cap(tmp_path, 5, 500) is None
    assert "max_output_files=4" in (over_cap(tmp_path, 4, 10**9) or "")
    assert "max_output_bytes=499" in (over_cap(tmp_path, 100, 499) or "")


def test_a_spec_cap_overrides_the_service_default() -> None:
    limits = OutputLimits(max_files=10, max_bytes=20)
    from ringtrain.jobs.models import JobInfo, JobState

    def job(**spec: object) -> JobInfo:
        return JobInfo(id="j-000000", cluster="c", state=JobState.RUNNING, created_at=0,
                       job_dir="/x", spec=parse_job_spec({"node_count": 1, "command": "x", **spec}))

    assert limits.for_job(job()) == (10, 20)
    assert limits.for_job(job(max_output_files=3, max_output_bytes=4)) == (3, 4)
