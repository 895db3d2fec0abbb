"""The job service and a client on another machine: the client runs in a network namespace that
reaches this host only through a veth pair (tests/jobs/netns.py), so the server sees a real
non-loopback peer. Plain HTTP from there is refused, saying why, unless the server was started
with --insecure; over TLS the CLI logs in with the pin and works: it submits a job whose working
dir only it has (uploaded), follows it, downloads its model and serves it by id, and a read
token it made cannot terminate. Needs root and `ip netns`; skips, saying so, without them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ringtrain.jobs.home import Home
from tests.waiting import stop_process

from .foreground_server import foreground_server
from .netns import VethNamespace, namespace_problem, veth_namespace
from .test_deploy import INPUT, SAVE_TINY_MODEL

TOKEN = "a-token-handed-to-remote-clients"

# What a client on the other machine sends: GET PATH with the token (or without), printed back.
ASK = textwrap.dedent("""
    import json, sys, httpx
    url, token = sys.argv[1], sys.argv[2]
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = httpx.get(url, headers=headers, timeout=30)
    print(json.dumps({"status": r.status_code, "body": r.json()}))
""")

# What a client on the other machine posts to a model server it runs there.
INFER = textwrap.dedent("""
    import json, sys, httpx
    r = httpx.post(sys.argv[1], json=json.loads(sys.argv[2]), timeout=60)
    print(json.dumps({"status": r.status_code, "body": r.json()}))
""")


@pytest.fixture(scope="module")
def other_machine() -> Iterator[VethNamespace]:
    problem = namespace_problem()
    if problem:
        pytest.skip(problem)
    with veth_namespace() as ns:
        yield ns


def _ask(ns: VethNamespace, url: str, token: str = "") -> tuple[int, dict]:
    proc = ns.run([sys.executable, "-c", ASK, url, token])
    assert proc.returncode == 0, proc.stderr[-3000:]
    answer = json.loads(proc.stdout)
    return answer["status"], answer["body"]


def test_plain_http_from_another_machine_is_refused_and_says_why(other_machine: VethNamespace,
                                                                 home: Home) -> None:
    ns = other_machine
    with foreground_server(home, "--host", ns.host_ip, "--token", TOKEN) as server:
        assert server.url.startswith(f"http://{ns.host_ip}:")
        assert "requests from other machines are refused" in server.log()
        status, body = _ask(ns, f"{server.url}/v1/health", TOKEN)
        assert status == 403, body
        assert "crossed the network in the clear" in body["detail"]
        assert "not accepted" in body["detail"] and "--tls" in body["detail"]
        status, body = _ask(ns, f"{server.url}/v1/clusters")  # no token at all
        assert status == 403 and "HTTPS only" in body["detail"], body
        # This host itself, at the same address (carried over loopback), is served as before.
        r = httpx.get(f"{server.url}/v1/health", headers={"Authorization": f"Bearer {TOKEN}"},
                      timeout=30)
        assert r.status_code == 200, r.text
    with foreground_server(home, "--host", ns.host_ip, "--token", TOKEN, "--insecure") as server:
        status, body = _ask(ns, f"{server.url}/v1/health", TOKEN)
        assert status == 200 and body["home"] == str(home.root), body
        assert _ask(ns, f"{server.url}/v1/health", "wrong")[0] == 401


def test_a_client_on_another_machine_logs_in_over_tls(other_machine: VethNamespace, home: Home,
                                                      tmp_path: Path) -> None:
    ns = other_machine
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGTRAIN_")}
    user = tmp_path / "remote-user"
    env.update(HOME=str(user), XDG_CONFIG_HOME=str(user / ".config"),
               XDG_CACHE_HOME=str(user / ".cache"))

    def ringtrain(*args: str) -> tuple[int, str, str]:
        proc = ns.run([sys.executable, "-m", "ringtrain.cli", *args], env)
        return proc.returncode, proc.stdout, proc.stderr

    with foreground_server(home, "--host", ns.host_ip, "--token", TOKEN, "--tls") as server:
        assert server.url.startswith(f"https://{ns.host_ip}:")
        other = "SHA256:" + ":".join(["CD"] * 32)
        rc, _, err = ringtrain("login", server.url, "--fingerprint", other,
                               "--token-file", str(token_file))
        assert rc == 1 and other in err and server.fingerprint in err, err
        rc, out, err = ringtrain("login", server.url, "--name", "lab", "--fingerprint",
                                 server.fingerprint, "--token-file", str(token_file))
        assert rc == 0, err
        rc, out, err = ringtrain("cluster", "create", "remote", "--nodes", "1", "-o", "json")
        assert rc == 0 and json.loads(out)["name"] == "remote", err
        rc, out, err = ringtrain("job", "list", "-o", "json")
        assert (rc, json.loads(out)) == (0, []), err
        assert not (user / ".ringtrain").exists()  # nothing was started on the client's side
        _work_from_the_other_machine(ns, ringtrain, env, tmp_path)


def _work_from_the_other_machine(ns: VethNamespace, ringtrain, env: dict[str, str],
                                 tmp_path: Path) -> None:
    """Submit a job from a working dir only the client has, follow it, download and serve its
    model there; a read token the client makes cannot terminate it."""
    laptop = tmp_path / "laptop"
    (laptop / "project").mkdir(parents=True)
    (laptop / "project" / "train.sh").write_text(SAVE_TINY_MODEL + "\n")
    spec = laptop / "job.json"
    spec.write_text(json.dumps({"name": "from-afar", "node_count": 1, "command": "sh train.sh",
                                "working_dir": str(laptop / "project"), "outputs": ["model"]}))
    rc, out, err = ringtrain("job", "submit", str(spec), "--cluster", "remote", "-o", "json")
    assert rc == 0, err
    assert "uploaded 1 file" in err  # not on the service's host: the client sent its folder
    job = json.loads(out)
    assert job["spec"]["working_dir"].startswith("upload://"), job["spec"]
    shutil.rmtree(laptop)  # the service must not need it
    rc, out, err = ringtrain("job", "logs", job["id"], "--follow")
    assert rc == 0, out + err
    rc, out, err = ringtrain("job", "show", job["id"], "-o", "json")
    assert rc == 0 and json.loads(out)["state"] == "succeeded", out + err
    got = tmp_path / "downloaded"
    rc, _, err = ringtrain("job", "download", job["id"], "outputs/model", "--to", str(got))
    assert rc == 0, err
    assert {p.name for p in got.rglob("*")} >= {"model.pt", "model.json"}, list(got.rglob("*"))
    _serve_by_id_there(ns, env, job["id"], tmp_path)
    rc, out, err = ringtrain("token", "create", "--scope", "read", "--name", "watcher", "-o",
                             "json")
    assert rc == 0, err
    read_token = json.loads(out)["token"]
    rc, _, err = ringtrain("job", "terminate", job["id"], "--token", read_token)
    assert rc != 0 and "read" in err and "scope" in err, err
    rc, out, err = ringtrain("job", "show", job["id"], "-o", "json", "--token", read_token)
    assert rc == 0 and json.loads(out)["state"] == "succeeded", err


def _serve_by_id_there(ns: VethNamespace, env: dict[str, str], job_id: str,
                       tmp_path: Path) -> None:
    """``ringtrain serve JOB_ID`` on the other machine: the model comes over TLS, the server
    answers an inference there."""
    ready = tmp_path / "serve-ready.json"
    proc = subprocess.Popen(["ip", "netns", "exec", ns.name, sys.executable, "-m",
                             "ringtrain.cli", "serve", job_id, "--port", "0", "--ready-file",
                             str(ready)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the model server never became ready"
            time.sleep(0.2)
        url = json.loads(ready.read_text())["url"]
        answer = ns.run([sys.executable, "-c", INFER, f"{url}/v2/models/model/infer",
                         json.dumps(INPUT)])
        assert answer.returncode == 0, answer.stderr[-3000:]
        reply = json.loads(answer.stdout)
        assert reply["status"] == 200, reply
        assert reply["body"]["outputs"][0]["shape"][0] == 1, reply
    finally:
        stop_process(proc)
