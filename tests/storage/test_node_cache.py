"""Staging inputs into a node cache from real stores (SeaweedFS's S3 and Azurite), uploading
outputs to them: what the job runner's storage steps do, driven directly."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

from ringtrain.storage.node_cache import NodeCache
from ringtrain.storage.outputs import OutputUploader
from ringtrain.storage.stage import stage_input
from ringtrain.storage.transfers import PART_BYTES
from tests.storage.servers import Store, bad_options

MB = 1_000_000


def _put_dataset(store: Store, prefix: str, files: int, size: int) -> dict[str, str]:
    fs = store.fs()
    digests = {}
    for i in range(files):
        data = hashlib.sha256(f"{prefix}{i}".encode()).digest() * (size // 32 + 1)
        data = data[:size]
        rel = f"part{i % 3}/f{i:04d}.bin"
        fs.pipe(f"{store.bucket}/{prefix}/{rel}", data)
        digests[rel] = hashlib.sha256(data).hexdigest()
    return digests


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in folder.rglob("*") if p.is_file()}


def _stage(store: Store, cache: NodeCache, url: str, lines: list[str], **kw) -> Path:
    return stage_input("data", url, store.options, cache, kw.pop("holder", "job-1.0"),
                       kw.pop("pid", os.getpid()), lines.append, **kw)


def test_stages_once_read_only_and_verified(store: Store, tmp_path: Path) -> None:
    digests = _put_dataset(store, "once", 20, 50_000)
    cache = NodeCache(tmp_path / "cache", 100 * MB)
    lines: list[str] = []
    local = _stage(store, cache, store.url("once"), lines)
    assert _digests(local) == digests
    assert not stat.S_IMODE(os.stat(next(local.rglob("*.bin"))).st_mode) & 0o222
    assert any("20/20 files" in line for line in lines)
    # a second job: the same entry, nothing fetched
    again: list[str] = []
    assert _stage(store, cache, store.url("once"), again, holder="job-2.0") == local
    assert again == [f"data: {store.url('once')} is in this node's cache (20 files)"]
    # a changed object is a new entry
    store.fs().pipe(f"{store.bucket}/once/part0/f0000.bin", b"changed")
    changed = _stage(store, cache, store.url("once"), [])
    assert changed != local and (changed / "part0/f0000.bin").read_bytes() == b"changed"


def test_single_object_is_a_file(store: Store, tmp_path: Path) -> None:
    store.fs().pipe(f"{store.bucket}/one/model.pt", b"weights" * 1000)
    local = _stage(store, NodeCache(tmp_path, 10 * MB), store.url("one/model.pt"), [])
    assert local.name == "model.pt" and local.read_bytes() == b"weights" * 1000


def test_wrong_credentials_name_the_input_and_hide_the_secret(store: Store,
                                                               tmp_path: Path) -> None:
    _put_dataset(store, "creds", 2, 1000)
    plan = _plan(store, tmp_path, {"data": {"url": store.url("creds"),
                                            "options": bad_options(store)}})
    run = subprocess.run([sys.executable, "-m", "ringtrain.storage.node_main", "stage", plan,
                          str(tmp_path / "result.json")], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 1
    assert f"input data ({store.url('creds')})" in run.stdout
    for value in bad_options(store).values():
        secret = value.split("AccountKey=")[-1].split(";")[0]
        assert secret not in run.stdout + run.stderr


def test_kill_mid_stage_resumes_without_fetching_again(store: Store, tmp_path: Path) -> None:
    digests = _put_dataset(store, "resume", 60, 200_000)
    plan = _plan(store, tmp_path, {"data": {"url": store.url("resume"),
                                            "options": store.options}}, concurrency=2)
    argv = [sys.executable, "-m", "ringtrain.storage.node_main", "stage", plan,
            str(tmp_path / "result.json")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    journal = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        journals = list((tmp_path / "cache" / "partial").glob("*/journal.jsonl"))
        if journals and len(journals[0].read_text().splitlines()) >= 10:
            journal = journals[0]
            break
        time.sleep(0.01)
    proc.kill()
    proc.wait(timeout=10)
    assert journal is not None, "the stager never got 10 files in"
    done = len(journal.read_text().splitlines())
    assert done < 60, "the stager finished before it was killed"
    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    resumed = [line for line in rerun.stdout.splitlines() if "resuming" in line]
    assert resumed and int(resumed[0].split("resuming: ")[1].split(" of")[0]) >= done
    local = Path(json.loads((tmp_path / "result.json").read_text())["data"])
    assert _digests(local) == digests  # no .part file left, every checksum equal


def test_eviction_keeps_held_entries(store: Store, tmp_path: Path) -> None:
    for name in ("ev1", "ev2", "ev3"):
        _put_dataset(store, name, 4, 250_000)  # 1 MB each
    cache = NodeCache(tmp_path / "cache", int(2.5 * MB))
    held = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        first = _stage(store, cache, store.url("ev1"), [], holder="a.0", pid=held.pid)
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        second = _stage(store, cache, store.url("ev2"), [], holder="b.0", pid=gone.pid)
        _stage(store, cache, store.url("ev3"), [], holder="c.0", pid=held.pid)
        assert first.exists(), "an entry a live job holds was evicted"
        assert not second.exists(), "the unheld entry was kept past the bound"
    finally:
        held.kill()
        held.wait()


def test_outputs_upload_as_they_settle_and_resume(store: Store, tmp_path: Path) -> None:
    folder = tmp_path / "outputs" / "model"
    folder.mkdir(parents=True)
    (folder / "ckpt-1.pt").write_bytes(b"a" * 1000)
    fs = store.fs()
    prefix = f"{store.bucket}/runs/job-x/model"
    up = OutputUploader(fs, prefix, folder, tmp_path / "journal.jsonl", lambda _line: None)
    assert up.run_pass(final=False) == 0  # seen once: not yet settled
    assert up.run_pass(final=False) == 1
    assert fs.cat(f"{prefix}/ckpt-1.pt") == b"a" * 1000
    (folder / "final.pt").write_bytes(b"b" * 3 * MB)
    again = OutputUploader(fs, prefix, folder, tmp_path / "journal.jsonl", lambda _line: None)
    assert again.run_pass(final=True) == 1  # the journal kept ckpt-1
    assert fs.size(f"{prefix}/final.pt") == 3 * MB


def test_kill_mid_upload_shows_nothing_partial_and_resumes(store: Store, tmp_path: Path) -> None:
    folder = tmp_path / "outputs"
    folder.mkdir()
    for i in range(40):
        (folder / f"ckpt-{i:02d}.pt").write_bytes(os.urandom(500_000))
    (folder / "big.pt").write_bytes(os.urandom(2 * PART_BYTES + 1000))  # in parts
    prefix = f"{store.bucket}/runs/killed"
    journal = tmp_path / "journal.jsonl"
    plan = _plan(store, tmp_path, {}, concurrency=2, outputs={
        "url": store.url("runs/killed"), "options": store.options, "folder": str(folder),
        "journal": str(journal)})
    argv = [sys.executable, "-m", "ringtrain.storage.node_main", "upload", plan]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if journal.exists() and len(journal.read_text().splitlines()) >= 8:
            break
        time.sleep(0.01)
    proc.kill()
    proc.wait(timeout=10)
    done = len(journal.read_text().splitlines())
    assert 8 <= done < 41, f"killed after {done} of 41 files"
    fs = store.fs()

    def stored() -> dict[str, str]:
        fs.invalidate_cache()
        names = [p for p in fs.find(prefix) if not p.rsplit("/", 1)[-1].startswith(".")]
        return {p.rsplit("/", 1)[-1]: hashlib.sha256(fs.cat(p)).hexdigest() for p in names}

    local = _digests(folder)
    for name, digest in stored().items():  # what a reader sees now: whole files or nothing
        assert digest == local[name], f"{name} is visible half-written"
    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    sent = int(rerun.stdout.split(" files uploaded to ")[0].rsplit("outputs: ", 1)[1])
    assert sent <= 41 - done, rerun.stdout  # what the journal had was not sent again
    assert stored() == local


def test_a_large_output_goes_in_parts(store: Store, tmp_path: Path) -> None:
    """A file above PART_BYTES is sent in parts of that size (so an upload holds parts in
    memory, not files): S3 lists a multipart ETag, Azure the blob's committed blocks."""
    folder = tmp_path / "outputs"
    folder.mkdir()
    data = os.urandom(2 * PART_BYTES + PART_BYTES // 2)
    (folder / "big.pt").write_bytes(data)
    fs = store.fs()
    prefix = f"{store.bucket}/runs/parts"
    up = OutputUploader(fs, prefix, folder, tmp_path / "journal.jsonl", lambda _line: None)
    assert up.run_pass(final=True) == 1
    assert hashlib.md5(fs.cat(f"{prefix}/big.pt")).digest() == hashlib.md5(data).digest()
    if store.kind == "seaweedfs":
        assert fs.info(f"{prefix}/big.pt")["ETag"].strip('"').endswith("-3")
    else:
        from azure.storage.blob import BlobClient

        blob = BlobClient.from_connection_string(store.options["connection_string"],
                                                 store.bucket, "runs/parts/big.pt")
        committed, _ = blob.get_block_list("committed")
        assert [b.size for b in committed] == [PART_BYTES, PART_BYTES, PART_BYTES // 2]


def test_stopped_store_fails_within_bound(store: Store, tmp_path: Path) -> None:
    _put_dataset(store, "stopped", 2, 1000)
    plan = _plan(store, tmp_path, {"data": {"url": store.url("stopped"),
                                            "options": store.options}}, stall_s=5)
    store.stop()  # for good: this module's last test
    run = subprocess.run([sys.executable, "-m", "ringtrain.storage.node_main", "stage", plan,
                          str(tmp_path / "r.json")], capture_output=True, text=True, timeout=180)
    assert run.returncode == 1
    assert "input data" in run.stdout and "error:" in run.stdout


def _plan(store: Store, tmp_path: Path, inputs: dict, **extra) -> str:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"cache_root": str(tmp_path / "cache"),
                                "cache_max_bytes": 10**9, "holder": "job.0",
                                "holder_pid": os.getpid(), "inputs": inputs, **extra}))
    return str(path)


