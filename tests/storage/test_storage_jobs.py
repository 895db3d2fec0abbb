"""The job service with data and models in a real store (SeaweedFS's S3, Azurite): the README's
Fashion-MNIST job reads its data from the bucket on a 2-node local cluster, its outputs are
uploaded, `ringtrain serve` loads the model from the bucket and answers one inference; a second
job reuses the node's copy; wrong credentials fail the job naming the input; and the secret's
value appears in no record, log, API answer or dashboard payload."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ringtrain.jobs.client.connection import connect, stop_server
from ringtrain.jobs.errors import SpecError
from ringtrain.jobs.home import Home
from ringtrain.jobs.models import ClusterSpec, JobState, parse_job_spec
from ringtrain.jobs.service.api.auth import home_token
from tests.storage.servers import Store, bad_options

REPO = Path(__file__).resolve().parents[2]
FASHION = Path("/usr/share/datasets/fashion-mnist")
TRAIN = ("python fashion_mnist.py --epochs 1 --limit-train 512 --limit-test 128 "
         "--batch-size 64 --data-dir \"$RINGTRAIN_INPUT_DATA\"")


@pytest.fixture(scope="module")
def service(store: Store, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Home, str]]:
    """A real job service whose home holds the store's credentials as the secret `creds`."""
    home = Home(tmp_path_factory.mktemp(f"home-{store.kind}") / "home")
    env = {**os.environ, "RINGTRAIN_HOME": str(home.root)}
    env.pop("RINGTRAIN_URL", None)
    for name, options in (("creds", store.options), ("wrong", bad_options(store))):
        subprocess.run([sys.executable, "-m", "ringtrain.cli", "secret", "set", name],
                       input=json.dumps(options), text=True, env=env, check=True, timeout=60)
    fs = store.fs()
    for f in FASHION.glob("*.gz"):
        fs.put_file(str(f), f"{store.bucket}/fashion/{f.name}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RINGTRAIN_HOME", str(home.root))
        mp.delenv("RINGTRAIN_URL", raising=False)
        client = connect(home=home)
        client.create_cluster(ClusterSpec(name="local", nodes=2, slots=1))
        yield home, client.url
        client.close()
    stop_server(home)


def _submit(url: str, home: Home, workdir: Path, **spec: object) -> str:
    client = connect(url=url, token=home_token(home))
    try:
        return client.submit("local", parse_job_spec({
            "node_count": 1, "command": TRAIN, "working_dir": str(workdir), **spec})).id
    finally:
        client.close()


def _wait(url: str, home: Home, job_id: str, timeout_s: float = 300) -> dict:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {home_token(home)}"},
                      timeout=10) as http:
        while time.monotonic() < deadline:
            job = http.get(f"/v1/jobs/{job_id}").json()
            if JobState(job["state"]).is_terminal():
                return job
            time.sleep(0.3)
    pytest.fail(f"job {job_id} did not end within {timeout_s} s")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("workdir")
    for name in ("fashion_mnist.py", "training_curves.py"):
        shutil.copy(REPO / "examples" / name, folder)
    return folder


def test_train_from_the_bucket_upload_and_serve_from_it(store: Store, service: tuple[Home, str],
                                                         workdir: Path, tmp_path: Path) -> None:
    home, url = service
    reads_before = _object_reads(store)
    job_id = _submit(url, home, workdir, node_count=2, name="fashion-store",
                     inputs={"data": {"url": store.url("fashion"), "secret": "creds"}},
                     outputs=["model"], outputs_url=store.url("runs/{job_id}"),
                     outputs_secret="creds")
    job = _wait(url, home, job_id)
    assert job["state"] == "succeeded", job
    remote = store.fs()
    stored = {Path(p).name for p in remote.find(f"{store.bucket}/runs/{job_id}/model")}
    assert {"model.pt", "model.json"} <= stored
    # each node staged: one fetched, the other waited for it or found it in the cache
    job_dir = Path(job["job_dir"])
    prep = [(job_dir / "prep" / f"node.{k}.stdout") for k in range(2)]
    logs = [p.read_text() if p.exists() else "" for p in prep]
    assert sum("4/4 files" in log for log in logs) >= 1, logs
    assert len(list((home.cache_folder / "entries").iterdir())) == 1

    # a second job on the warm cache fetches nothing
    second = _wait(url, home, _submit(url, home, workdir, name="again",
                                      inputs={"data": {"url": store.url("fashion"),
                                                       "secret": "creds"}}))
    assert second["state"] == "succeeded", second
    again = (Path(second["job_dir"]) / "prep" / "node.0.stdout").read_text()
    assert "is in this node's cache" in again and "files," not in again
    if reads_before is not None:  # the store's own count: each file crossed the wire once
        assert _object_reads(store) - reads_before == 4

    # the model served straight from the bucket
    ready = tmp_path / "ready.json"
    env = {**os.environ, "RINGTRAIN_HOME": str(home.root), "RINGTRAIN_CACHE": str(tmp_path)}
    serve = subprocess.Popen(
        [sys.executable, "-m", "ringtrain.cli", "serve", store.url(f"runs/{job_id}/model"),
         "--secret", "creds", "--port", "0", "--ready-file", str(ready)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and serve.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ready.exists(), serve.stdout.read() if serve.stdout else ""
        served = json.loads(ready.read_text())["url"]
        body = {"inputs": [{"name": "input", "shape": [1, 1, 28, 28], "datatype": "FP32",
                            "data": [0.5] * 784}]}
        answer = httpx.post(f"{served}/v2/models/model/infer", json=body, timeout=30)
        assert answer.status_code == 200 and answer.json()["outputs"], answer.text
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        out = serve.communicate(timeout=30)[0]

    # a deployment of the job loads its model from the bucket, not from the job's folder
    client = connect(url=url, token=home_token(home))
    try:
        deployment = client.deploy(job_id)
        assert deployment.model == store.url(f"runs/{job_id}/model")
        deadline = time.monotonic() + 240
        while (deployment := client.get_deployment(deployment.id)).state.value != "ready":
            assert time.monotonic() < deadline and deployment.state.value == "starting", \
                deployment
            time.sleep(0.3)
        answer = httpx.post(f"{deployment.urls[0]}/v2/models/model/infer", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        client.stop_deployment(deployment.id)
    finally:
        client.close()
    _assert_secret_nowhere(store, home, url, [job_id, deployment.id], out)


def test_wrong_credentials_fail_naming_the_input(store: Store, service: tuple[Home, str],
                                                 workdir: Path) -> None:
    home, url = service
    job = _wait(url, home, _submit(url, home, workdir, name="wrong",
                                   inputs={"data": {"url": store.url("fashion"),
                                                    "secret": "wrong"}}), timeout_s=180)
    assert job["state"] == "failed"
    assert "staging inputs failed on node 0" in job["message"]
    assert f"input data ({store.url('fashion')})" in (
        Path(job["job_dir"]) / "prep" / "node.0.stdout").read_text()
    _assert_secret_nowhere(store, home, url, [job["id"]], "", values=bad_options(store))


def test_a_missing_secret_or_library_is_refused_at_submit(store: Store, service: tuple[Home, str],
                                                          workdir: Path) -> None:
    home, url = service
    client = connect(url=url, token=home_token(home))
    with pytest.raises(SpecError) as refused:
        client.submit("local", parse_job_spec({
            "node_count": 1, "command": "true",
            "inputs": {"data": {"url": store.url("x"), "secret": "nope"},
                       "web": "ftp://host/file"}}))
    client.close()
    text = str(getattr(refused.value, "errors", "")) + str(refused.value)
    assert "no secret named 'nope'" in text and "unknown scheme ftp://" in text


def _assert_secret_nowhere(store: Store, home: Home, url: str, job_ids: list[str], extra: str,
                           values: dict | None = None) -> None:
    secrets = [v.split("AccountKey=")[-1].split(";")[0] if "AccountKey=" in v else v
               for v in (values or store.options).values() if len(v) >= 12]
    secrets = [s for s in secrets if not s.startswith("http")]
    assert secrets
    headers = {"Authorization": f"Bearer {home_token(home)}"}
    answers = [httpx.get(f"{url}/v1/jobs", headers=headers).text,
               httpx.get(f"{url}/v1/clusters", headers=headers).text]
    answers += [httpx.get(f"{url}/v1/jobs/{j}", headers=headers).text for j in job_ids]
    with httpx.stream("GET", f"{url}/v1/events", headers=headers, timeout=10) as events:
        for chunk in events.iter_text():
            answers.append(chunk)
            if len("".join(answers)) > 2000:
                break
    texts = [extra, *answers]
    # the credentials' own places: the secrets, and the plans of attempts still running (mode
    # 600, removed as each attempt ends)
    for plan in home.plans_folder.glob("*.json"):
        assert plan.stat().st_mode & 0o777 == 0o600
    private = ("secrets", "plans", "cache")
    for path in home.root.rglob("*"):
        if path.is_file() and not set(private) & set(path.relative_to(home.root).parts):
            texts.append(path.read_bytes().decode(errors="replace"))
    env = subprocess.run([sys.executable, "-m", "ringtrain.cli", "env"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "RINGTRAIN_HOME":
                                                      str(home.root)})
    texts.append(env.stdout + env.stderr)
    for secret in secrets:
        found = [t[:200] for t in texts if secret in t]
        assert not found, f"a secret value leaked: {found}"


def test_a_killed_stager_and_service_resume_without_fetching_again(
        store: Store, service: tuple[Home, str], workdir: Path) -> None:
    home, url = service
    fs = store.fs()
    digests = {}
    for i in range(400):
        data = os.urandom(20_000)
        fs.pipe(f"{store.bucket}/many/f{i:04d}.bin", data)
        digests[f"f{i:04d}.bin"] = hashlib.sha256(data).hexdigest()
    check = ("python -c \"import hashlib, json, os, sys; d = os.environ['RINGTRAIN_INPUT_DATA']; "
             "json.dump({n: hashlib.sha256(open(os.path.join(d, n), 'rb').read()).hexdigest() "
             "for n in os.listdir(d)}, open(os.environ['RINGTRAIN_OUTPUT_SUMS'] + '/s.json', "
             "'w'))\"")
    job_id = _submit(url, home, workdir, name="resume", command=check, max_retries=1,
                     outputs=["sums"],
                     inputs={"data": {"url": store.url("many"), "secret": "creds"}})
    journal = None
    deadline = time.monotonic() + 120
    while journal is None and time.monotonic() < deadline:
        found = list((home.cache_folder / "partial").glob("*/journal.jsonl"))
        if found and len(found[0].read_text().splitlines()) >= 20:
            journal = found[0]
        time.sleep(0.01)
    assert journal is not None, "staging never got going"
    # kill -9 the service and the stager at once, mid-stage
    server = json.loads(home.server_file.read_text())["pid"]
    stagers = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
               and _cmdline(p).endswith(f"stage {home.plans_folder}/{job_id}.0.json "
                                        f"{home.share_root}/jobs/{job_id}/launcher/staged-0.json")]
    assert stagers, "no stager process found"
    os.kill(server, signal.SIGKILL)
    for pid in stagers:
        os.kill(pid, signal.SIGKILL)
    done_before = len(journal.read_text().splitlines())
    assert done_before < 400, "staging finished before the kill"
    client = connect(home=home)  # a new server adopts the job
    client.close()
    url = json.loads(home.server_file.read_text())["url"]
    job = _wait(url, home, job_id)
    assert job["state"] == "succeeded" and job["attempt"] == 1, job
    prep = (Path(job["job_dir"]) / "prep" / "node.0.stdout").read_text()
    resumed = int(prep.split("resuming: ")[1].split(" of")[0])
    assert resumed >= done_before
    sums = json.loads((Path(job["job_dir"]) / "outputs" / "sums" / "s.json").read_text())
    assert sums == digests  # every file whole, none partial, none fetched twice wrongly
    assert not list(home.plans_folder.glob(f"{job_id}.*")), "a plan outlived its attempt"


def _object_reads(store: Store) -> int | None:
    """How many objects the store has served (SeaweedFS's metrics; None for Azurite)."""
    if "metrics" not in store.extra:
        return None
    text = httpx.get(store.extra["metrics"], timeout=10).text
    counts = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("SeaweedFS_s3_time_to_first_byte_millisecond_count{")
              and 'type="GET"' in line]
    return int(sum(counts))


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""
