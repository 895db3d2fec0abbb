"""End to end: the CLI against a real server on loopback, running real 2-rank jobs through
`ringtrain run`, with a real SQLite file; kill -9 and restart of the server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from ringtrain import proc_stat
from ringtrain.jobs.client.connection import read_server_file
from ringtrain.jobs.home import Home
from ringtrain.jobs.service.executors.local import procs
from ringtrain.jobs.service.store import SQLiteStore

from .conftest import CLI, wait_for, wait_for_ticks

PRINT_RANK = ("python -c \"import os; r = os.environ['HOROVOD_RANK']; "
              "print('rank', r, 'of', os.environ['HOROVOD_SIZE'], os.environ['RINGTRAIN_JOB_ID'], "
              "os.environ['GREETING'], open('data.txt').read().strip()); "
              "open(os.path.join(os.environ['RINGTRAIN_OUTPUT_MODEL'], 'rank' + r + '.txt'), 'w')"
              ".write('weights ' + r)\"")


def spec_file(tmp_path: Path, name: str, **spec: object) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, **spec}))
    return str(path)


def job_state(cli: CLI, job_id: str) -> dict:
    rc, out, _ = cli("job", "show", job_id, "-o", "json")
    assert rc == 0
    return json.loads(out)


def started(home: Home, job_id: str) -> bool:
    """Rank 0 of the job has printed 'started'."""
    log = home.share_root / "jobs" / job_id / "stdouterr/rank.0/stdout"
    return log.exists() and b"started" in log.read_bytes()


def api(home: Home) -> httpx.Client:
    """A raw HTTP client of the home's server, with its token."""
    info = read_server_file(home)
    return httpx.Client(base_url=info.url, timeout=10,
                        headers={"Authorization": f"Bearer {info.token}"})


def test_two_rank_job_through_the_cli(home: Home, cli: CLI, tmp_path: Path) -> None:
    rc, out, _ = cli("cluster", "create", "local2", "--nodes", "2", "--slots", "1", "-o", "json")
    assert rc == 0 and json.loads(out)["node_counts"]["idle"] == 2
    rc, out, _ = cli("cluster", "show", "local2")
    assert "allocation:  steady" in out
    project = tmp_path / "project"
    project.mkdir()
    (project / "data.txt").write_text("from-the-working-dir")
    spec = spec_file(tmp_path, "two", experiment="exp1", node_count=2, command=PRINT_RANK,
                     working_dir=str(project), outputs=["model"],
                     environment={"GREETING": "hello"},
                     job_preparation="echo prepared node $RINGTRAIN_NODE_INDEX")

    rc, out, err = cli("job", "submit", spec, "--cluster", "local2", "--follow")
    returned = time.time()
    assert rc == 0, err
    job_id = out.splitlines()[0]
    assert f"rank 0 of 2 {job_id} hello from-the-working-dir" in out
    assert f"job {job_id} succeeded" in err
    job = job_state(cli, job_id)
    assert job["state"] == "succeeded" and job["exit_code"] == 0
    assert job["ended_at"] <= returned  # follow ended with the job (its lag: benchmarks/)

    rc, out, _ = cli("job", "list", "--experiment", "exp1", "-o", "json")
    assert [j["id"] for j in json.loads(out)] == [job_id]
    rc, out, _ = cli("job", "logs", job_id, "--rank", "1")
    assert f"rank 1 of 2 {job_id}" in out
    rc, out, _ = cli("job", "files", job_id, "-o", "json")
    paths = {f["path"] for f in json.loads(out)}
    assert {"outputs/model/rank0.txt", "outputs/model/rank1.txt", "prep/node.1.stdout",
            "stdouterr/rank.1/stdout", "wd/data.txt"} <= paths
    assert (Path(job["job_dir"]) / "prep/node.1.stdout").read_text() == "prepared node 1\n"
    rc, out, _ = cli("job", "download", job_id, "outputs/model", "--to", str(tmp_path / "dl"))
    assert rc == 0 and (tmp_path / "dl/model/rank1.txt").read_text() == "weights 1"

    # Paths out of the job's folder, through the CLI and the raw API.
    rc, _, err = cli("job", "download", job_id, "../../../jobs.sqlite", "--to", str(tmp_path))
    assert rc == 2 and "leads outside the job's folder" in err
    with api(home) as http:
        r = http.get(f"/v1/jobs/{job_id}/download", params={"path": "../../../jobs.sqlite"})
        assert r.status_code == 400
        r = http.get(f"/v1/jobs/{job_id}/files", params={"path": "/etc"})
        assert r.status_code == 400
        bad = {"cluster": "local2", "spec": {"node_count": 0, "command": "x", "priority": "?"}}
        r = http.post("/v1/jobs", json=bad)
        assert r.status_code == 422
        assert {e["field"] for e in r.json()["errors"]} == {"node_count", "priority"}
        assert "/v1/jobs/{job_id}/logs" in http.get("/openapi.json").json()["paths"]

    # Unknown ids and bad requests: clear messages, non-zero exits.
    for args in (("job", "show", "nope-000000"), ("job", "logs", "nope-000000"),
                 ("job", "terminate", "nope-000000"), ("job", "files", "nope-000000"),
                 ("cluster", "show", "nope"), ("cluster", "resize", "nope", "--nodes", "1")):
        rc, _, err = cli(*args)
        assert rc == 1 and "nope" in err, args
    rc, _, err = cli("job", "logs", job_id, "--rank", "5")
    assert rc == 2 and "rank 5 is out of range: job" in err
    rc, _, err = cli("job", "submit", spec, "--cluster", "nope")
    assert rc == 1 and "no cluster named 'nope'" in err
    bad_spec = spec_file(tmp_path, "bad", node_count=0, command="x", prio="high")
    rc, out, err = cli("job", "submit", bad_spec, "--cluster", "local2", "-o", "json")
    assert rc == 2 and "node_count:" in err and "prio: unknown field" in err
    assert {e["field"] for e in json.loads(out)["errors"]} == {"node_count", "prio"}
    too_wide = spec_file(tmp_path, "wide", node_count=1, process_count_per_node=2, command="x")
    rc, _, err = cli("job", "submit", too_wide, "--cluster", "local2")
    assert rc == 2 and "process_count_per_node: at most 1" in err
    rc, _, err = cli("job", "terminate", job_id)
    assert rc == 1 and "already succeeded" in err

    rc, _, _ = cli("job", "delete", job_id)
    assert rc == 0 and not Path(job["job_dir"]).exists()
    assert cli("job", "show", job_id)[0] == 1
    rc, out, _ = cli("cluster", "delete", "local2")
    assert rc == 0 and "deleted" in out
    assert json.loads(cli("cluster", "list", "-o", "json")[1]) == []


def test_terminate_resize_and_wall_clock(home: Home, cli: CLI, tmp_path: Path) -> None:
    assert cli("cluster", "create", "c", "--nodes", "2")[0] == 0
    sleeper = "python -c \"import time; print('started', flush=True); time.sleep(120)\""
    _, long_id, _ = cli("job", "submit", spec_file(tmp_path, "long", node_count=1,
                                                   command=sleeper), "--cluster", "c")
    _, capped_id, _ = cli("job", "submit", spec_file(
        tmp_path, "capped", node_count=1, command=sleeper, max_wall_clock_time=2,
        max_retries=2), "--cluster", "c")
    long_id, capped_id = long_id.strip(), capped_id.strip()
    wait_for(lambda: started(home, long_id), timeout_s=90)
    assert job_state(cli, long_id)["state"] == "running"

    # Shrinking to zero never kills the running job: its node leaves after it.
    rc, out, _ = cli("cluster", "resize", "c", "--nodes", "0", "-o", "json")
    info = json.loads(out)
    assert info["allocation_state"] == "resizing" and info["node_counts"]["leaving"] >= 1
    wait_for_ticks(home)  # the scheduler has seen the shrink: the job runs on
    assert job_state(cli, long_id)["state"] == "running"

    pids = procs.job_pids(long_id)
    assert pids  # the runner, `ringtrain run` and the rank
    rc, out, _ = cli("job", "terminate", long_id, "-o", "json")
    assert rc == 0 and json.loads(out)["state"] in ("terminating", "terminated")
    wait_for(lambda: job_state(cli, long_id)["state"] == "terminated", timeout_s=30)
    assert procs.job_pids(long_id) == []
    assert not any(proc_stat.is_alive(p, None) for p in pids)

    capped = wait_for(lambda: (j := job_state(cli, capped_id))["state"] == "failed" and j,
                      timeout_s=60)
    assert capped["message"] == "exceeded max_wall_clock_time of 2 s; stopped"
    assert capped["attempt"] == 0  # a wall-clock stop is not retried
    assert procs.job_pids(capped_id) == []
    info = json.loads(cli("cluster", "show", "c", "-o", "json")[1])
    assert (info["current_nodes"], info["allocation_state"]) == (0, "steady")


def test_killed_server_loses_nothing(home: Home, cli: CLI, tmp_path: Path) -> None:
    assert cli("cluster", "create", "c", "--nodes", "3")[0] == 0
    survivor = ("python -c \"import time; print('started', flush=True); time.sleep(6); "
                "print('finished')\"")
    doomed = "python -c \"import time; print('started', flush=True); time.sleep(120)\""
    retried = ("if [ -e \"$RINGTRAIN_OUTPUT_STATE/first\" ]; then echo second attempt; else "
               "touch \"$RINGTRAIN_OUTPUT_STATE/first\"; echo started; sleep 120; fi")
    ids = {}
    for name, command, extra in (("survivor", survivor, {}), ("doomed", doomed, {}),
                                 ("retried", retried, {"max_retries": 1, "outputs": ["state"]})):
        rc, out, err = cli("job", "submit", spec_file(tmp_path, name, node_count=1,
                                                      command=command, **extra),
                           "--cluster", "c")
        assert rc == 0, err
        ids[name] = out.strip()

    wait_for(lambda: all(started(home, job_id) for job_id in ids.values()), timeout_s=120)
    first = read_server_file(home)
    os.kill(first.pid, signal.SIGKILL)
    wait_for(lambda: not proc_stat.is_alive(first.pid, None), timeout_s=10)
    # While no server runs: the survivor goes on; the other two lose their processes.
    assert procs.job_pids(ids["survivor"])
    for name in ("doomed", "retried"):
        procs.signal_job(ids[name], None, signal.SIGKILL)
    store = SQLiteStore(home.db_path)
    assert {j.id: j.state.value for j in store.list_jobs()} == dict.fromkeys(ids.values(),
                                                                             "running")
    store.close()

    rc, out, _ = cli("job", "list", "-o", "json")  # starts a new server
    assert rc == 0 and read_server_file(home).pid != first.pid
    assert {j["id"] for j in json.loads(out)} == set(ids.values())
    info = json.loads(cli("cluster", "show", "c", "-o", "json")[1])
    assert info["target_nodes"] == 3

    doomed_job = wait_for(lambda: (j := job_state(cli, ids["doomed"]))["state"] == "failed"
                          and j, timeout_s=30)
    assert "ended without reporting an exit status" in doomed_job["message"]
    survivor_job = wait_for(lambda: (j := job_state(cli, ids["survivor"]))["state"] in (
        "succeeded", "failed") and j, timeout_s=60)
    assert survivor_job["state"] == "succeeded"
    assert "finished" in cli("job", "logs", ids["survivor"])[1]
    retried_job = wait_for(lambda: (j := job_state(cli, ids["retried"]))["state"] in (
        "succeeded", "failed") and j, timeout_s=90)
    assert (retried_job["state"], retried_job["attempt"]) == ("succeeded", 1)
    assert "second attempt" in cli("job", "logs", ids["retried"])[1]
    rc, out, _ = cli("job", "files", ids["retried"], "attempts")
    assert "attempts/0/stdouterr/rank.0/stdout" in out

    rc, out, _ = cli("server", "stop")
    assert rc == 0 and "stopped" in out
    assert cli("server", "status")[0] == 1


def test_binding_off_loopback_needs_a_token(home: Home, cli: CLI) -> None:
    rc, _, err = cli("server", "--host", "0.0.0.0")
    assert rc == 2 and "pass --token" in err
    assert not home.server_file.exists()


def test_token_is_required_when_set(home: Home, cli: CLI) -> None:
    server = subprocess.Popen([sys.executable, "-m", "ringtrain.cli", "server", "--token", "s3"],
                              env={**os.environ, "RINGTRAIN_HOME": str(home.root)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = wait_for(lambda: (info := read_server_file(home)) and info.url, timeout_s=30)
        with httpx.Client(base_url=url, timeout=10) as http:
            wait_for(lambda: _answers(http), timeout_s=30)
            assert http.get("/v1/clusters").status_code == 401
            assert http.get("/v1/clusters",
                            headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert http.get("/v1/clusters",
                            headers={"Authorization": "Bearer s3"}).status_code == 200
        rc, _, err = cli("cluster", "list", "--url", url)
        assert rc == 1 and "Authorization: Bearer" in err
        assert cli("cluster", "list", "--url", url, "--token", "s3")[0] == 0
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=20)


def _answers(http: httpx.Client) -> bool:
    try:
        http.get("/v1/health")
        return True
    except httpx.TransportError:
        return False
