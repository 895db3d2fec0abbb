"""Connection floods (issue 35): health latency and log growth of the job service and of
`ringtrain serve` while N connections that never finish their request header are held open.

For each server (a process of its own, started by its CLI, with its own descriptor limit:
inherited, or ``--server-nofile``): ``--calm`` seconds of health probes without a flood, then
``--seconds`` of flood. The flood runs in worker processes (each raising its soft
``RLIMIT_NOFILE`` to the hard limit and holding at most that less a reserve), which open their
share of ``--connections`` (default 20,000), each sending half a request header and nothing
more, and open a new one for each the server closes, so that the pressure lasts the whole
flood. A probe process sends ``GET`` health on a new connection every ``--every`` seconds, with a
``--probe-timeout`` bound. Prints one JSON line per server: the probes' p50/p99/max latency and
failures, calm and flooded, their ratios, the connections opened and closed by the server, and
how much the server's log grew during the flood (bytes, lines, tracebacks).

    python benchmarks/flood.py [--connections 20000] [--seconds 30] [--calm 5]
        [--server-nofile N] [--servers jobs,serve]

Goal (issue 35): health answers within 1 s throughout the 20,000-connection flood, and the log
grows by less than 1 MB. Everything runs on loopback, in a temporary folder deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c",
       "import sys; from ringtrain.cli import main; sys.exit(main(sys.argv[1:]))"]
#: Descriptors a flood worker keeps for itself.
RESERVE = 64

# Holds `share` connections to port until `until` (time.time()), each sent half a header; one
# the server closed is replaced at once. Prints what it did as JSON at the end.
FLOOD = r"""
import json, resource, selectors, socket, sys, time
port, share, until = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
reopen = sys.argv[4] == "1"
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
half = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: flood\r\n"
selector = selectors.DefaultSelector()
opened = closed = failed = 0
def open_one():
    global opened, failed
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    except OSError:
        failed += 1
        s.close()
        return
    try:
        s.send(half)
    except OSError:
        pass  # not connected yet: it then sends nothing at all, which is as unfinished
    selector.register(s, selectors.EVENT_READ)
    opened += 1
while time.time() < until:
    while (opened < share or reopen and len(selector.get_map()) < share) \
            and time.time() < until:
        open_one()
        if opened % 500 == 0:
            break  # look at what was closed meanwhile
    for key, _ in selector.select(0.05):
        try:
            data = key.fileobj.recv(4096)
        except OSError:
            data = b""
        if not data:
            selector.unregister(key.fileobj)
            key.fileobj.close()
            closed += 1
print(json.dumps({"opened": opened, "closed_by_server": closed, "connect_failed": failed,
                  "held_at_end": len(selector.get_map())}))
"""

# GET health on a new connection every `every` s (http.client: a new httpx client costs tens of
# milliseconds of its own): one line "start latency" or "start fail".
PROBE = r"""
import http.client, sys, time
host, port, path, token = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
every, bound = float(sys.argv[5]), float(sys.argv[6])
headers = {"Authorization": "Bearer " + token} if token else {}
while True:
    t0 = time.time()
    try:
        c = http.client.HTTPConnection(host, port, timeout=bound)
        c.request("GET", path, headers=headers)
        r = c.getresponse()
        r.read()
        c.close()
        print(f"{t0:.6f} {time.time() - t0:.6f}" if r.status == 200 else
              f"{t0:.6f} fail {r.status}", flush=True)
    except Exception as e:
        print(f"{t0:.6f} fail {type(e).__name__}", flush=True)
    time.sleep(max(0.0, every - (time.time() - t0)))
"""


def tiny_model(folder: Path) -> Path:
    """A small classifier saved as training saves it: the server's own speed is what counts."""
    import torch

    from ringtrain.models.cifar_cnn import CifarCNN
    from ringtrain.models.saved import ModelInfo, save_model

    kwargs = {"num_classes": 3, "in_channels": 1, "image_size": 12}
    torch.manual_seed(0)
    save_model(folder, CifarCNN(**kwargs), ModelInfo(arch="cifar_cnn", task="classification",
                                                     classes=["a", "b", "c"], kwargs=kwargs,
                                                     input_shape=[1, 12, 12]))
    return folder


@contextmanager
def server(kind: str, tmp: Path, nofile: int | None) -> Iterator[tuple[int, str, str, Path, int]]:
    """Start the job service or the model server; yields its port, health path, token, log and
    pid."""
    home, log_path = tmp / f"{kind}-home", tmp / f"{kind}.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RINGTRAIN_HOME": str(home)}
    env.pop("RINGTRAIN_URL", None)
    if kind == "jobs":
        args = ["server"]
    else:
        args = ["serve", str(tiny_model(tmp / "model")), "--port", "0", "--ready-file",
                str(tmp / "ready.json")]
    command = [*CLI, *args]
    if nofile is not None:
        command = ["sh", "-c", f'ulimit -n {nofile} && exec "$@"', "sh", *command]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        ready = home / "server.json" if kind == "jobs" else tmp / "ready.json"
        deadline = time.monotonic() + 120
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{kind} did not start:\n{log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        time.sleep(0.5)  # written just before it listens
        record = json.loads(ready.read_text())
        port = int(record["url"].rsplit(":", 1)[1])
        health = "/v1/health" if kind == "jobs" else "/v2/health/live"
        yield port, health, record.get("token", ""), log_path, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def latencies(samples: list[tuple[float, str]], start: float, end: float) -> dict[str, object]:
    """p50, p99 and max (ms) of the probes sent in [start, end), and how many failed."""
    inside = [took for at, took in samples if start <= at < end]
    ok = sorted(float(t) for t in inside if t != "fail")
    if not ok:
        return {"probes": len(inside), "failed": len(inside)}
    p99 = statistics.quantiles(ok, n=100, method="inclusive")[98] if len(ok) > 1 else ok[0]
    return {"probes": len(inside), "failed": len(inside) - len(ok),
            "p50_ms": round(1000 * statistics.median(ok), 1), "p99_ms": round(1000 * p99, 1),
            "max_ms": round(1000 * ok[-1], 1)}


def flood_workers(connections: int) -> list[int]:
    """The shares of the flood workers: each within its hard descriptor limit, less a reserve."""
    most = resource.getrlimit(resource.RLIMIT_NOFILE)[1] - RESERVE
    if most <= 0 or resource.getrlimit(resource.RLIMIT_NOFILE)[1] == resource.RLIM_INFINITY:
        most = 1 << 16
    count = -(-connections // most)
    return [connections // count + (i < connections % count) for i in range(count)]


def run(kind: str, args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    with server(kind, tmp, args.server_nofile) as (port, health, token, log_path, pid):
        server_nofile = resource.prlimit(pid, resource.RLIMIT_NOFILE)[0]
        out_path = tmp / f"{kind}-probe.txt"
        with open(out_path, "w") as out:
            probe = subprocess.Popen([sys.executable, "-c", PROBE, "127.0.0.1", str(port),
                                      health, token, str(args.every),
                                      str(args.probe_timeout)], stdout=out)
        try:
            calm_start = time.time()
            time.sleep(args.calm)
            log_before = log_path.stat().st_size
            flood_start = time.time()
            until = flood_start + args.seconds
            workers = [subprocess.Popen([sys.executable, "-c", FLOOD, str(port), str(share),
                                         str(until), str(int(args.reopen))],
                                        stdout=subprocess.PIPE, text=True)
                       for share in flood_workers(args.connections)]
            done = [json.loads(w.communicate(timeout=args.seconds + 120)[0]) for w in workers]
            flood_end = time.time()
            grown = log_path.read_bytes()[log_before:]
        finally:
            probe.terminate()
            probe.wait(30)
    samples = [(float(at), took) for at, took, *_ in
               (line.split() for line in out_path.read_text().splitlines() if " " in line)]
    calm = latencies(samples, calm_start, flood_start)
    flooded = latencies(samples, flood_start, flood_end)
    result: dict[str, object] = {
        "benchmark": "flood", "server": kind, "connections": args.connections,
        "flood_s": args.seconds, "server_nofile": server_nofile,
        "load_avg_1m": round(os.getloadavg()[0], 2), "calm": calm, "flooded": flooded,
        **{k: sum(d[k] for d in done) for k in done[0]},
        "log_growth_bytes": len(grown), "log_growth_lines": grown.count(b"\n"),
        "log_tracebacks": grown.count(b"Traceback")}
    for key in ("p50_ms", "max_ms"):
        if key in calm and key in flooded:
            result[f"{key[:-3]}_ratio"] = round(flooded[key] / calm[key], 2)  # type: ignore[operator]
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--connections", type=int, default=20_000)
    p.add_argument("--seconds", type=float, default=30.0, help="flood duration")
    p.add_argument("--calm", type=float, default=5.0, help="probing before the flood (s)")
    p.add_argument("--every", type=float, default=0.1, help="seconds between health probes")
    p.add_argument("--probe-timeout", type=float, default=10.0)
    p.add_argument("--server-nofile", type=int, help="the server's ulimit -n (default: ours)")
    p.add_argument("--reopen", action="store_true",
                   help="open a new connection for each the server closes, at once")
    p.add_argument("--servers", default="jobs,serve")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="flood-"))
    try:
        for kind in args.servers.split(","):
            print(json.dumps(run(kind, args, tmp)), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
