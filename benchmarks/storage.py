"""Object storage: ringtrain's input staging and output upload against the stores' own tools.

    python benchmarks/storage.py [--sizes small,large] [--files 10000] [--large-mb 256]
                                 [--repeats 3] [--concurrency 16] [--stores seaweedfs,azurite]
    python benchmarks/storage.py --sweep-concurrency 4,8,16,32 --files 2000 --large-mb 64

starts SeaweedFS's S3 gateway and Azurite (Microsoft's Azure Storage emulator) on loopback, as
the tests do (``tests/storage/servers.py``; ``scripts/setup.sh`` installs both), in a temporary
folder that is removed at the end (Ctrl-C and SIGTERM included), and prints one JSON line per
measurement. The data sets are random bytes made once per run: *small*, ``--files`` files of
100 KB (default 10,000), and *large*, 4 files of ``--large-mb`` MB; each is put in each store
once. For each store, set and direction, ringtrain and a peer move the same data to or from the
same server ``--repeats`` times, alternating which goes first, after ``--warmup`` untimed runs
of each (default 1: the first transfer after another kind, or after the previous measurement's
clean-up, is slower). A line reports both medians (files/s for the small set, MB/s for the
large one, MB = 10^6 bytes), every repetition's seconds, and the median of the paired ratios
ringtrain / peer (above 1: ringtrain is faster) with its bootstrap 95% interval.

- download: ``stage_input`` of the folder URL into a fresh ``NodeCache`` (listing, transfers,
  checksums, publishing the entry: everything a job's staging does) against, on SeaweedFS,
  ``aws s3 sync s3://BUCKET/PREFIX DIR`` (awscli's defaults: 10 concurrent requests, 8 MB
  parts) and, on Azurite, azure-storage-blob's own loop: ``list_blobs`` and
  ``download_blob(max_concurrency=8).readinto(file)`` per blob in a thread pool as wide as
  ringtrain's ``--concurrency``.
- upload: ``OutputUploader.run_pass(final=True)`` of the folder against ``aws s3 sync DIR
  s3://...`` and against ``upload_blob(max_concurrency=8)`` per file in the same thread pool.

``aws`` runs with the store's standard variables (``env_of``) and an empty config file, so its
own defaults apply; its fixed cost (``aws s3 sync`` of an empty prefix: interpreter start,
one listing) is reported as ``peer_fixed_s`` and counts in its times, as it does for a user.
Each line also gives the client's CPU seconds (ringtrain's process, the ``aws`` process, the
Azure loop's process; medians): on a shared machine they vary less than the clock. Azure
uploads go to a fresh container each, dropped afterwards; S3 uploads to a fresh prefix, kept
until the end. Goal: ratio ≥ 1.0 everywhere.

``--sweep-concurrency 4,8,16,32`` measures ringtrain alone at each width (the order of the
widths rotating between repetitions) and prints a line per width with its paired ratio to the
width ``--concurrency`` names (above 1: faster than it), which is what ``DEFAULT_CONCURRENCY``
is chosen from. On loopback a request costs no network round trip, so the width matters less
here than against a remote store; the large set has only 4 files to spread.

Azurite is one Node.js process: on a small machine its own rate bounds both sides on the small
set, and it slows as a container fills, so the small set there takes minutes per run at the
default 10,000 files (``--files 2000`` keeps a run of both stores near 15 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import importlib
import importlib.metadata
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from stats import bootstrap_median_ci

from ringtrain.storage import transfers
from ringtrain.storage.locations import open_store
from ringtrain.storage.node_cache import NodeCache
from ringtrain.storage.outputs import OutputUploader
from ringtrain.storage.stage import stage_input

REPO = Path(__file__).resolve().parents[1]
AWS = Path(sys.executable).with_name("aws")
SMALL_BYTES = 100_000
LARGE_FILES = 4
MB = 1_000_000
#: Per-blob parallelism of the Azure peer (azure-storage-blob's own ``max_concurrency``).
AZ_BLOB_CONCURRENCY = 8
HOLDER = "bench"


def _servers() -> ModuleType:
    """tests/storage/servers.py: the stores the tests start (the repository is no package)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return importlib.import_module("tests.storage.servers")


def _quiet(_line: str) -> None:
    pass


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def machine() -> str:
    return f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start"


# --- data -----------------------------------------------------------------------------------

def make_data(root: Path, sizes: list[str], files: int, large_mb: int) -> dict[str, Path]:
    """The data sets as local folders of random bytes."""
    made = {}
    if "small" in sizes:
        folder = root / "small"
        for i in range(files):
            path = folder / f"d{i // 1000:03d}" / f"f{i:06d}.bin"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(os.urandom(SMALL_BYTES))
        made["small"] = folder
    if "large" in sizes:
        folder = root / "large"
        folder.mkdir(parents=True)
        for i in range(LARGE_FILES):
            with open(folder / f"large{i}.bin", "wb") as f:
                for _ in range(large_mb):
                    f.write(os.urandom(MB))
        made["large"] = folder
    return made


def tree(folder: Path) -> tuple[int, int]:
    """Files and bytes below ``folder`` (hidden partial files included: they should be none)."""
    count = total = 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            count += 1
            total += os.path.getsize(os.path.join(dirpath, name))
    return count, total


def rmtree(folder: Path) -> None:
    """Remove ``folder``, read-only folders (a published cache entry) included."""
    for dirpath, _, _ in os.walk(folder):
        os.chmod(dirpath, 0o700)
    shutil.rmtree(folder, ignore_errors=True)


# --- ringtrain ------------------------------------------------------------------------------

def rt_download(store: Any, prefix: str, dest: Path, width: int) -> None:
    cache = NodeCache(dest, max_bytes=1 << 50)
    stage_input("bench", store.url(prefix), store.options, cache, HOLDER, os.getpid(), _quiet,
                width)


def rt_upload(store: Any, folder: Path, url: str, journal: Path, width: int) -> None:
    fs, path = open_store(url, store.options)
    OutputUploader(fs, path, folder, journal, _quiet, width).run_pass(final=True)


# --- peers ----------------------------------------------------------------------------------

def aws_env(store: Any, servers: ModuleType, tmp: Path) -> dict[str, str]:
    config = tmp / "aws-config"
    config.write_text("")
    return {**os.environ, **servers.env_of(store), "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CONFIG_FILE": str(config), "AWS_SHARED_CREDENTIALS_FILE": str(config),
            "AWS_EC2_METADATA_DISABLED": "true", "AWS_PAGER": ""}


def aws_sync(store: Any, env: dict[str, str], src: str, dst: str) -> None:
    argv = [str(AWS), "s3", "sync", src, dst, "--endpoint-url", store.extra["endpoint"],
            "--only-show-errors", "--no-progress"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"aws s3 sync {src} {dst}: exit {proc.returncode}: "
                           f"{proc.stderr.strip()[-2000:]}")


def az_container(store: Any, container: str, width: int) -> Any:
    """A ContainerClient whose connection pool holds every request the peer makes at once (the
    library's default pool of 10 would reconnect for the rest)."""
    import requests
    from azure.core.pipeline.transport import RequestsTransport
    from azure.storage.blob import ContainerClient

    session = requests.Session()
    adapter = requests.adapters.HTTPAdapter(pool_connections=4,
                                            pool_maxsize=width * AZ_BLOB_CONCURRENCY)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return ContainerClient.from_connection_string(
        store.options["connection_string"], container,
        transport=RequestsTransport(session=session, session_owner=False))


def az_download(store: Any, prefix: str, dest: Path, width: int) -> None:
    client = az_container(store, store.bucket, width)
    names = [b.name for b in client.list_blobs(name_starts_with=prefix + "/")]

    def fetch(name: str) -> None:
        target = dest / name[len(prefix) + 1:]
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as f:
            client.get_blob_client(name).download_blob(
                max_concurrency=AZ_BLOB_CONCURRENCY).readinto(f)

    with cf.ThreadPoolExecutor(width) as pool:
        for _ in pool.map(fetch, names):
            pass


def az_upload(store: Any, folder: Path, container: str, prefix: str, width: int) -> None:
    client = az_container(store, container, width)
    files = [Path(d) / n for d, _, names in os.walk(folder) for n in names]

    def put(path: Path) -> None:
        with open(path, "rb") as f:
            client.get_blob_client(f"{prefix}/{path.relative_to(folder).as_posix()}"
                                   ).upload_blob(f, overwrite=True,
                                                 max_concurrency=AZ_BLOB_CONCURRENCY)

    with cf.ThreadPoolExecutor(width) as pool:
        for _ in pool.map(put, files):
            pass


# --- measuring ------------------------------------------------------------------------------

def _cpu() -> float:
    """CPU seconds of this process and of its finished children (an ``aws`` run)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), \
        resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(work: Callable[[], None]) -> tuple[float, float]:
    """Wall-clock and client CPU seconds of ``work``."""
    wall, cpu = time.perf_counter(), _cpu()
    work()
    return time.perf_counter() - wall, _cpu() - cpu


class Bench:
    """One store with its data put in it, and the ways to move that data."""

    def __init__(self, store: Any, servers: ModuleType, data: dict[str, Path], work: Path):
        self.store = store
        self.data = data
        self.work = work
        self.env = aws_env(store, servers, work) if store.kind == "seaweedfs" else {}
        self.count = 0
        for size, folder in data.items():  # put once, by ringtrain: not measured
            rt_upload(store, folder, store.url(f"in/{size}"), work / f"seed-{size}.jsonl",
                      transfers.DEFAULT_CONCURRENCY)
            listed = len(store.fs().find(f"{store.bucket}/in/{size}"))
            if listed != tree(folder)[0]:
                raise RuntimeError(f"{store.kind}: {listed} objects in in/{size}, "
                                   f"{tree(folder)[0]} files put")

    def _fresh(self, what: str) -> str:
        self.count += 1
        return f"{what}-{self.count}"

    def _check_local(self, size: str, folder: Path, who: str) -> None:
        got, want = tree(folder), tree(self.data[size])
        if got != want:
            raise RuntimeError(f"{self.store.kind} {who} download of {size}: {got[0]} files, "
                               f"{got[1]} bytes arrived; {want[0]} files, {want[1]} expected")

    def download(self, who: str, size: str, width: int) -> tuple[float, float]:
        dest = self.work / self._fresh(f"down-{who}")
        prefix = f"in/{size}"
        try:
            if who == "ringtrain":
                took = timed(lambda: rt_download(self.store, prefix, dest, width))
                (_, entry), = NodeCache(dest, 1 << 50).entries()
                self._check_local(size, entry.data, who)
            elif self.store.kind == "seaweedfs":
                took = timed(lambda: aws_sync(self.store, self.env, self.store.url(prefix),
                                              str(dest)))
                self._check_local(size, dest, who)
            else:
                took = timed(lambda: az_download(self.store, prefix, dest, width))
                self._check_local(size, dest, who)
        finally:
            rmtree(dest)
        return took

    def upload(self, who: str, size: str, width: int) -> tuple[float, float]:
        """Into a fresh prefix of the bucket (S3) or a fresh container (Azure: Azurite deletes
        blobs in time growing with their number, a container at once)."""
        fresh = self._fresh(who)
        fs = self.store.fs()
        if self.store.kind == "seaweedfs":
            container, prefix = self.store.bucket, f"out/{fresh}"
        else:
            container, prefix = f"out-{fresh}", "out"
            fs.mkdir(container)
        url = f"{self.store.scheme}://{container}/{prefix}"
        folder = self.data[size]
        if who == "ringtrain":
            journal = self.work / f"{fresh}.jsonl"
            took = timed(lambda: rt_upload(self.store, folder, url, journal, width))
        elif self.store.kind == "seaweedfs":
            took = timed(lambda: aws_sync(self.store, self.env, str(folder), url))
        else:
            took = timed(lambda: az_upload(self.store, folder, container, prefix, width))
        listed = fs.find(f"{container}/{prefix}", detail=True)
        got = (len(listed), sum(int(v.get("size") or 0) for v in listed.values()))
        if got != tree(folder):
            raise RuntimeError(f"{self.store.kind} {who} upload of {size}: {got} files and "
                               f"bytes stored, {tree(folder)} expected")
        # Not measured. Azurite drops a container in one request; SeaweedFS keeps the objects
        # to the end (deleting 10,000 there can outlast their upload on a loaded machine).
        if self.store.kind == "azurite":
            from azure.storage.blob import BlobServiceClient

            BlobServiceClient.from_connection_string(
                self.store.options["connection_string"]).delete_container(container)
        return took

    def peer_fixed_s(self) -> float | None:
        """``aws s3 sync`` of an empty prefix: what every aws run pays before a byte moves."""
        if self.store.kind != "seaweedfs":
            return None
        dest = self.work / self._fresh("empty")
        took, _ = timed(lambda: aws_sync(self.store, self.env, self.store.url("no-such-prefix"),
                                         str(dest)))
        rmtree(dest)
        return took

    def peer_name(self) -> str:
        if self.store.kind == "seaweedfs":
            return f"aws s3 sync (awscli {_version('awscli')}, default 10 concurrent requests)"
        return (f"azure-storage-blob {_version('azure-storage-blob')} "
                f"{{download_blob|upload_blob}}(max_concurrency={AZ_BLOB_CONCURRENCY}) "
                "in a thread pool as wide as ringtrain's")


def rate(size: str, data: Path, seconds: float) -> float:
    files, nbytes = tree(data)
    return files / seconds if size == "small" else nbytes / MB / seconds


def paired(rt: list[float], peer: list[float]) -> dict[str, Any]:
    """ringtrain / peer as rates (peer seconds over ringtrain's), per repetition and median."""
    ratios = [p / r for r, p in zip(rt, peer)]
    low, high = bootstrap_median_ci(ratios)
    return {"ratio": round(statistics.median(ratios), 3),
            "ratio_ci95": [round(low, 3), round(high, 3)],
            "ratios": [round(x, 3) for x in ratios]}


def _median(runs: list[tuple[float, float]], which: int) -> float:
    return statistics.median(r[which] for r in runs)


def compare(bench: Bench, direction: str, size: str, args: argparse.Namespace,
            fixed: float | None) -> dict[str, Any]:
    run = bench.download if direction == "download" else bench.upload
    load = [os.getloadavg()[0]]
    rt: list[tuple[float, float]] = []
    peer: list[tuple[float, float]] = []
    for _ in range(args.warmup):  # the first transfer after another pays for the switch
        run("peer", size, args.concurrency)
        run("ringtrain", size, args.concurrency)
    for i in range(args.repeats):
        order = [("ringtrain", rt), ("peer", peer)]
        for who, runs in order if i % 2 == 0 else order[::-1]:
            runs.append(run(who, size, args.concurrency))
    load.append(os.getloadavg()[0])
    files, nbytes = tree(bench.data[size])
    result: dict[str, Any] = {
        "benchmark": "storage", "store": bench.store.kind, "direction": direction,
        "set": size, "files": files, "bytes": nbytes, "concurrency": args.concurrency,
        "repeats": args.repeats, "warmup": args.warmup,
        "unit": "files/s" if size == "small" else "MB/s",
        "ringtrain": round(rate(size, bench.data[size], _median(rt, 0)), 2),
        "peer": round(rate(size, bench.data[size], _median(peer, 0)), 2),
        "peer_tool": bench.peer_name(),
        **paired([r[0] for r in rt], [r[0] for r in peer]),
        "ringtrain_s": [round(r[0], 3) for r in rt], "peer_s": [round(r[0], 3) for r in peer],
        # the client's CPU (ringtrain's process, aws's or the Azure loop's): on a shared
        # machine less noisy than the clock, and what the client takes from the job's cores
        "ringtrain_cpu_s": round(_median(rt, 1), 2), "peer_cpu_s": round(_median(peer, 1), 2),
        "cpu_ratio_peer_over_ringtrain": round(_median(peer, 1) / _median(rt, 1), 3),
    }
    if fixed is not None:
        result["peer_fixed_s"] = round(fixed, 3)
    result.update({"goal": "ratio >= 1.0", "goal_met": result["ratio"] >= 1.0,
                   "load_average": [round(x, 1) for x in load], "machine": args.machine})
    return result


def sweep(bench: Bench, direction: str, size: str, widths: list[int],
          args: argparse.Namespace) -> list[dict[str, Any]]:
    run = bench.download if direction == "download" else bench.upload
    load = [os.getloadavg()[0]]
    runs: dict[int, list[tuple[float, float]]] = {w: [] for w in widths}
    for _ in range(args.warmup):
        run("ringtrain", size, args.concurrency)
    for i in range(args.repeats):
        shift = i % len(widths)
        for width in widths[shift:] + widths[:shift]:
            runs[width].append(run("ringtrain", size, width))
    load.append(os.getloadavg()[0])
    files, nbytes = tree(bench.data[size])
    lines = []
    for width in widths:
        line: dict[str, Any] = {
            "benchmark": "storage_sweep", "store": bench.store.kind, "direction": direction,
            "set": size, "files": files, "bytes": nbytes, "concurrency": width,
            "repeats": args.repeats, "warmup": args.warmup,
            "unit": "files/s" if size == "small" else "MB/s",
            "ringtrain": round(rate(size, bench.data[size], _median(runs[width], 0)), 2),
            "ringtrain_s": [round(r[0], 3) for r in runs[width]],
            "ringtrain_cpu_s": round(_median(runs[width], 1), 2),
        }
        if args.concurrency in runs:  # above 1: this width is faster than that one
            line[f"vs_concurrency_{args.concurrency}"] = paired(
                [r[0] for r in runs[width]], [r[0] for r in runs[args.concurrency]])
        line.update({"load_average": [round(x, 1) for x in load], "machine": args.machine})
        lines.append(line)
    return lines


# --- running --------------------------------------------------------------------------------

@contextmanager
def terminated_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so that the servers are stopped either way."""
    def interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def start(servers: ModuleType, kind: str, folder: Path) -> Any:
    if kind == "seaweedfs":
        if not servers.WEED.exists() or not AWS.exists():
            sys.exit(f"SeaweedFS ({servers.WEED}) or aws ({AWS}) is not installed: "
                     "run scripts/setup.sh")
        return servers.start_seaweed(folder)
    if not servers.AZURITE.exists() or not shutil.which("node"):
        sys.exit(f"Azurite ({servers.AZURITE}) or node is not installed: run scripts/setup.sh")
    return servers.start_azurite(folder)


@contextmanager
def stopping_servers(servers: ModuleType) -> Iterator[None]:
    """Kill every server process started inside, also one interrupted before it answered."""
    started: list[subprocess.Popen] = []
    spawn = servers._spawn

    def tracked(argv: list[str], log: Path) -> subprocess.Popen:
        started.append(spawn(argv, log))
        return started[-1]

    servers._spawn = tracked
    try:
        yield
    finally:
        servers._spawn = spawn
        for proc in started:
            servers.kill_group(proc)
            proc.wait(timeout=10)


def run(args: argparse.Namespace, emit: Callable[[dict[str, Any]], None]) -> None:
    servers = _servers()
    with tempfile.TemporaryDirectory(prefix="ringtrain-bench-storage-",
                                     ignore_cleanup_errors=True) as tmp, \
            stopping_servers(servers):
        root = Path(tmp)
        data = make_data(root / "data", args.sizes, args.files, args.large_mb)
        for kind in args.stores:
            store = start(servers, kind, root / kind)
            try:
                work = root / f"work-{kind}"
                work.mkdir()
                bench = Bench(store, servers, data, work)
                fixed = None if args.sweep else bench.peer_fixed_s()
                for size in args.sizes:
                    for direction in ("download", "upload"):
                        if args.sweep:
                            for line in sweep(bench, direction, size, args.sweep, args):
                                emit(line)
                        else:
                            emit(compare(bench, direction, size, args, fixed))
            finally:
                servers.kill_group(store.proc)
                store.proc.wait(timeout=10)


def _list(text: str, allowed: tuple[str, ...]) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    wrong = [x for x in items if x not in allowed]
    if wrong or not items:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(allowed)}")
    return items


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=lambda s: _list(s, ("small", "large")),
                   default=["small", "large"], help="data sets (default small,large)")
    p.add_argument("--files", type=int, default=10_000,
                   help="files of 100 KB in the small set (default 10000)")
    p.add_argument("--large-mb", type=int, default=256,
                   help=f"MB of each of the {LARGE_FILES} files of the large set (default 256)")
    p.add_argument("--repeats", type=int, default=3, help="repetitions of each (default 3)")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed runs of each side before them (default 1)")
    p.add_argument("--concurrency", type=int, default=transfers.DEFAULT_CONCURRENCY,
                   help="ringtrain's transfers at once, and the Azure peer's thread pool "
                        f"(default {transfers.DEFAULT_CONCURRENCY})")
    p.add_argument("--stores", type=lambda s: _list(s, ("seaweedfs", "azurite")),
                   default=["seaweedfs", "azurite"], help="default seaweedfs,azurite")
    p.add_argument("--sweep-concurrency", dest="sweep",
                   type=lambda s: [int(x) for x in s.split(",") if x.strip()],
                   help="measure ringtrain alone at each of these widths (e.g. 4,8,16,32)")
    args = p.parse_args(argv)
    if min(args.files, args.large_mb, args.repeats, args.concurrency) < 1 or args.warmup < 0:
        p.error("--files, --large-mb, --repeats and --concurrency must be positive")
    if args.sweep is not None and (not args.sweep or min(args.sweep) < 1):
        p.error("--sweep-concurrency takes positive widths, e.g. 4,8,16,32")
    args.machine = machine()

    def emit(line: dict[str, Any]) -> None:
        print(json.dumps(line), flush=True)

    try:
        with terminated_as_interrupt():
            run(args, emit)
    except KeyboardInterrupt:
        print("interrupted: the servers are stopped and their folders removed", file=sys.stderr)
        sys.stdout.flush()
        os._exit(130)  # a transfer thread may still wait on a stopped server: not for it
    return 0


if __name__ == "__main__":
    sys.exit(main())
