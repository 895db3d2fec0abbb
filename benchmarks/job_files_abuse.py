"""What a job's folder can do to the service (issue 22), measured; prints one JSON line.

Jobs: a real job server on loopback with one job holding ``--files`` files under ``outputs/``
(nested folders of 1,000, plus one flat folder of ``--flat``), and ``--big`` large files:

* the first page of ``GET /files`` (nested and flat) and the server's RSS then;
* one archive request of the small files read to its end (the service's rate, nothing written);
* ``ringtrain job download ID outputs`` (one archive request): files/s on the small files, MB/s
  on the large ones, against the peer ``tar -c | tar -x`` of the same folders in the same run;
* ``/v1/health`` latency, probed every 50 ms throughout from a process of its own (max, p99 and
  the max of each phase), and the server's peak RSS.

Model server: ``ringtrain serve`` with ``--max-memory-mib``, 20 clients posting a 6300x6300 PNG
at once: every status, and the server's peak RSS against its budget.

Everything is made in a temporary folder and deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c",
       "import sys; from ringtrain.cli import main; sys.exit(main(sys.argv[1:]))"]


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


class Sampler:
    """Samples a process's RSS in a thread, every ``every_s``."""

    def __init__(self, pid: int, every_s: float = 0.05):
        self.pid, self.every_s = pid, every_s
        self.rss: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.rss.append(rss_mb(self.pid))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# The health probe runs in a process of its own: probing from a thread of the process that
# also reads the archive would measure this process's GIL, not the server.
PROBE = """
import sys, time, httpx
url, token, every = sys.argv[1], sys.argv[2], float(sys.argv[3])
with httpx.Client(base_url=url, headers={"Authorization": "Bearer " + token}, timeout=60) as c:
    while True:
        t0 = time.perf_counter()
        c.get("/v1/health").raise_for_status()
        took = time.perf_counter() - t0
        print(f"{time.time():.6f} {took:.6f}", flush=True)
        time.sleep(max(0.0, every - took))
"""


class HealthProbe:
    """``GET /v1/health`` every ``every_s`` from a separate process; latencies by phase."""

    def __init__(self, url: str, token: str, every_s: float = 0.05):
        self._args = [sys.executable, "-c", PROBE, url, token, str(every_s)]
        self.phases: list[tuple[str, float, float]] = []
        self.samples: list[tuple[float, float]] = []

    def __enter__(self) -> HealthProbe:
        # A file, not a pipe: nobody reads until the end, and a full pipe would stop the probe.
        self._out = tempfile.TemporaryFile("w+")
        self._proc = subprocess.Popen(self._args, stdout=self._out, text=True)
        return self

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.time()
        try:
            yield
        finally:
            self.phases.append((name, start, time.time()))

    def __exit__(self, *exc: object) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=30)
        self._out.seek(0)
        stdout = self._out.read()
        self._out.close()
        for line in stdout.splitlines():
            at, took = line.split()
            self.samples.append((float(at), float(took)))

    def summary(self) -> dict[str, object]:
        """Max and p99 over the run, and the max of each phase, in milliseconds."""
        latency = [took for _, took in self.samples]
        by_phase = {name: round(1000 * max((took for at, took in self.samples
                                             if start <= at - took and at <= end), default=0), 1)
                    for name, start, end in self.phases}
        return {"health_max_ms": round(1000 * max(latency), 1),
                "health_p99_ms": round(1000 * statistics.quantiles(latency, n=100)[98], 1),
                "health_probes": len(latency), "health_max_ms_by_phase": by_phase}


def make_files(root: Path, count: int, flat: int, big: int, big_mib: int) -> None:
    """``count`` files of 100 bytes (``flat`` of them in one folder), ``big`` of ``big_mib``."""
    payload = b"x" * 100
    nested = count - flat
    for d in range(-(-nested // 1000)):
        folder = root / "o" / f"d{d:04d}"
        folder.mkdir(parents=True)
        for i in range(min(1000, nested - d * 1000)):
            fd = os.open(folder / f"f{i:04d}", os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, payload)
            os.close(fd)
    folder = root / "o" / "flat"
    folder.mkdir(parents=True)
    for i in range(flat):
        fd = os.open(folder / f"{i:07d}.txt", os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, payload)
        os.close(fd)
    block = os.urandom(1 << 20)
    (root / "big").mkdir()
    for b in range(big):
        with open(root / "big" / f"b{b}.bin", "wb") as f:
            for _ in range(big_mib):
                f.write(block)


def tar_peer(src: Path, sub: str, dest: Path) -> float:
    """Seconds for ``tar -c | tar -x`` of ``src/sub`` into ``dest``."""
    dest.mkdir(parents=True)
    t0 = time.perf_counter()
    subprocess.run(f"tar -cf - -C {src} {sub} | tar -xf - -C {dest}", shell=True, check=True)
    return time.perf_counter() - t0


def jobs_part(args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    env = {**os.environ, "RINGTRAIN_HOME": str(tmp / "home"), "PYTHONPATH": str(REPO)}
    env.pop("RINGTRAIN_URL", None)
    def run(*a: str) -> str:
        return subprocess.run([*CLI, *a], env=env, check=True, capture_output=True,
                              text=True, timeout=3600).stdout

    run("cluster", "create", "idle", "--nodes", "0")
    spec = tmp / "spec.yaml"
    spec.write_text("name: many\nnode_count: 1\ncommand: 'true'\noutputs: [o]\n")
    job_id = run("job", "submit", str(spec), "--cluster", "idle").strip()
    from ringtrain.jobs.client.connection import read_server_file
    from ringtrain.jobs.home import Home
    from ringtrain.jobs.service.api.auth import home_token

    home = Home(tmp / "home")
    info = read_server_file(home)
    pid = info.pid
    outputs = home.share_root / "jobs" / job_id / "outputs"
    t0 = time.perf_counter()
    make_files(outputs, args.files, args.flat, args.big, args.big_mib)
    made_s = time.perf_counter() - t0
    out: dict[str, object] = {"files": args.files, "flat_folder_files": args.flat,
                              "make_files_s": round(made_s, 1),
                              "server_rss_idle_mb": round(rss_mb(pid), 1)}
    headers = {"Authorization": f"Bearer {home_token(home)}"}
    with httpx.Client(base_url=info.url, headers=headers, timeout=60) as http, \
            Sampler(pid) as sampled, HealthProbe(info.url, home_token(home)) as probe:
        time.sleep(1.0)  # the probe's interpreter starts
        for name, path in (("nested", "outputs"), ("flat", "outputs/o/flat")):
            with probe.phase(f"first_page_{name}"):
                t0 = time.perf_counter()
                page = http.get(f"/v1/jobs/{job_id}/files", params={"path": path}).json()
                out[f"first_page_{name}_s"] = round(time.perf_counter() - t0, 3)
            assert len(page["files"]) == 1000 and page["next_cursor"]
        out["server_rss_after_pages_mb"] = round(rss_mb(pid), 1)
        # The service's side alone: one archive request read to its end, nothing written.
        with probe.phase("archive_stream"):
            t0 = time.perf_counter()
            received = 0
            with http.stream("GET", f"/v1/jobs/{job_id}/archive",
                             params={"path": "outputs/o"}) as r:
                for chunk in r.iter_raw():
                    received += len(chunk)
            took = time.perf_counter() - t0
        out["archive_stream_files_per_s"] = round(args.files / took)
        out["archive_stream_mb_per_s"] = round(received / 1e6 / took, 1)
        results = {}
        for name, sub in (("small", "o"), ("big", "big")):
            dest = tmp / f"dl_{name}"
            with probe.phase(f"download_{name}"):
                t0 = time.perf_counter()
                listed = run("job", "download", job_id, f"outputs/{sub}", "--to", str(dest))
                took = time.perf_counter() - t0
            count = listed.count("\n")
            size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file()) \
                if name == "big" else count * 100
            shutil.rmtree(dest)
            with probe.phase(f"tar_peer_{name}"):
                peer_s = tar_peer(outputs, sub, tmp / f"peer_{name}")
            shutil.rmtree(tmp / f"peer_{name}")
            results[name] = (count, size, took, peer_s)
    count, _, took, peer_s = results["small"]
    out.update({"download_small_files": count, "download_small_s": round(took, 1),
                "download_files_per_s": round(count / took),
                "tar_peer_files_per_s": round(count / peer_s),
                "files_per_s_ratio_to_tar": round(peer_s / took, 3)})
    count, size, took, peer_s = results["big"]
    out.update({"download_big_mb": round(size / 1e6),
                "download_mb_per_s": round(size / 1e6 / took, 1),
                "tar_peer_mb_per_s": round(size / 1e6 / peer_s, 1),
                "mb_per_s_ratio_to_tar": round(peer_s / took, 3),
                "server_rss_peak_mb": round(max(sampled.rss), 1), **probe.summary()})
    run("server", "stop")
    return out


def serve_part(args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    import torch
    from PIL import Image

    from ringtrain.models.cifar_cnn import CifarCNN
    from ringtrain.models.saved import ModelInfo, save_model

    kwargs = {"num_classes": 3, "in_channels": 1, "image_size": 12}
    torch.manual_seed(0)
    save_model(tmp / "model", CifarCNN(**kwargs),
               ModelInfo(arch="cifar_cnn", task="classification", classes=["a", "b", "c"],
                         kwargs=kwargs, input_shape=[1, 12, 12]))
    png = io.BytesIO()
    Image.new("RGB", (6300, 6300)).save(png, format="PNG")
    body = png.getvalue()
    ready = tmp / "ready.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    server = subprocess.Popen([*CLI, "serve", str(tmp / "model"), "--port", "0", "--queue-size",
                               "64", "--max-memory-mib", str(args.budget_mib), "--ready-file",
                               str(ready)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert server.poll() is None and time.monotonic() < deadline, "serve did not start"
            time.sleep(0.1)
        url = json.loads(ready.read_text())["url"]
        idle = rss_mb(server.pid)
        statuses: list[int] = []

        def post() -> None:
            with httpx.Client(timeout=120) as c:
                statuses.append(c.post(f"{url}/v2/models/model/image", content=body,
                                       headers={"content-type": "image/png"}).status_code)

        with Sampler(server.pid, every_s=0.02) as sampled:
            posters = [threading.Thread(target=post) for _ in range(20)]
            for t in posters:
                t.start()
            for t in posters:
                t.join()
        peak = max(sampled.rss)
        return {"serve_budget_mib": args.budget_mib, "serve_rss_idle_mb": round(idle, 1),
                "serve_rss_peak_mb": round(peak, 1),
                "serve_peak_over_budget_mb": round(peak - args.budget_mib * 1.048576, 1),
                "serve_200": statuses.count(200), "serve_503": statuses.count(503),
                "serve_504": statuses.count(504),
                "serve_other": len(statuses) - sum(statuses.count(s) for s in (200, 503, 504))}
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=1_000_000)
    p.add_argument("--flat", type=int, default=100_000)
    p.add_argument("--big", type=int, default=4)
    p.add_argument("--big-mib", type=int, default=256)
    p.add_argument("--budget-mib", type=int, default=512)
    p.add_argument("--skip-jobs", action="store_true")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="job_files_abuse-"))
    try:
        out: dict[str, object] = {"benchmark": "job_files_abuse", "load_avg": os.getloadavg()[0]}
        if not args.skip_jobs:
            out.update(jobs_part(args, tmp))
        out.update(serve_part(args, tmp))
        print(json.dumps(out))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
