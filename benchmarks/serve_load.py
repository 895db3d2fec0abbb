"""Load test of `ringtrain serve`: closed-loop clients at several concurrencies, batching on/off.

Serves one model twice in a real server process (``ringtrain serve``), once with dynamic batching
and once with ``--max-batch-size 1``, and drives each on loopback with closed-loop clients (each
sends its next request when the last is answered) at each count of ``--clients``, ``--duration``
seconds per count. Prints one JSON line with, per mode and client count, the throughput, p50/p99
latency, status counts (failures are anything but 200 and 503) and the CPU time per request of
the server process and of the load generator; and the model's own time per input, alone in this
process with the server's torch threads, at batch 1 and at the largest batch.

How "at equal p99" is made comparable: a closed loop's latency grows with its client count, so
each mode is credited with the most throughput it reached at a client count whose p99 stayed
within ``--p99-budget-ms``; ``ratio_at_budget`` is batched over unbatched on that footing.
``ratio_at_max_clients`` compares the two at the largest client count (saturation), where
``failed`` must be 0. The model's own ``batching_ceiling`` (time per input at batch 1 over time
per input at the largest batch) bounds what batching can gain where the model is the work.

    python benchmarks/serve_load.py [--model DIR] [--clients 1,4,16,64] [--duration 5] [--binary]
        [--p99-budget-ms 50] [--load-generator lean|httpx]

``--binary`` sends the input as raw bytes after the JSON (KServe v2's binary tensor data
extension) and asks for the output the same way, instead of numbers in JSON. The default load
generator (benchmarks/lean_load.py, asyncio streams, one pre-encoded request) costs a small part
of what the server does per request; ``httpx`` is the earlier client, about as costly as the server
on the same cores. Without ``--model`` it serves the Fashion-MNIST CNN (random weights: the speed
does not depend on them). Goals (issue 12): batched ≥ 3× unbatched at equal p99; p99 at one
client ≤ 2× the model's own latency; zero failed requests at saturation.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import torch
from lean_load import closed_loop, encode_post, measured

from ringtrain.models.fashion_cnn import FashionCNN
from ringtrain.models.saved import ModelInfo, load_model, save_model
from ringtrain.proc_stat import stat_fields
from ringtrain.serve.server import model_threads

INFER = "/v2/models/model/infer"


def fashion_cnn(directory: Path) -> Path:
    """The Fashion-MNIST CNN saved as training saves it."""
    save_model(directory, FashionCNN(), ModelInfo(
        arch="fashion_cnn", task="classification", classes=[str(i) for i in range(10)],
        input_shape=[1, 28, 28]))
    return directory


def model_ms_per_input(model_dir: Path, batch: int, threads: int, reps: int = 100) -> float:
    """Median milliseconds per input of one forward pass on ``batch`` inputs, outside any server,
    with ``threads`` torch threads (as the server runs it)."""
    model, info = load_model(model_dir)
    x = torch.rand(batch, *info.input_shape)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            for _ in range(10):
                model(x)
            times = []
            for _ in range(reps):
                t = time.perf_counter()
                model(x)
                times.append(time.perf_counter() - t)
    finally:
        torch.set_num_threads(before)
    return statistics.median(times) * 1000 / batch


def start_server(model_dir: Path, flags: list[str]) -> tuple[subprocess.Popen, str]:
    """``ringtrain serve`` on a free loopback port; returns the process and its URL."""
    proc = subprocess.Popen([sys.executable, "-m", "ringtrain.cli", "serve", str(model_dir),
                             "--port", "0", *flags], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    line = proc.stdout.readline()  # the process exits (closing stdout) if it cannot start
    if " at " not in line:
        proc.kill()
        raise SystemExit(f"serve_load: the server did not start: {line!r}")
    return proc, line.split(" at ")[1].split()[0]


def request_body(x: torch.Tensor, binary: bool) -> tuple[bytes, dict[str, str]]:
    """An inference request for ``x``: numbers in JSON, or its raw bytes after the JSON."""
    spec: dict[str, object] = {"name": "input", "shape": list(x.shape), "datatype": "FP32"}
    if not binary:
        body = json.dumps({"inputs": [{**spec, "data": x.flatten().tolist()}]}).encode()
        return body, {"content-type": "application/json"}
    raw = x.numpy().tobytes()
    header = json.dumps({"inputs": [{**spec, "parameters": {"binary_data_size": len(raw)}}],
                         "parameters": {"binary_data_output": True}}).encode()
    return header + raw, {"content-type": "application/octet-stream",
                          "inference-header-content-length": str(len(header))}


def httpx_closed_loop(url: str, body: bytes, headers: dict[str, str], clients: int,
                      duration: float) -> dict[str, object]:
    """The earlier load generator: ``clients`` closed-loop httpx clients (same results as
    :func:`lean_load.closed_loop`)."""
    latencies: list[float] = []
    codes: dict[str, int] = {}

    async def run() -> float:
        stop = time.perf_counter() + duration
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
            async def one_client() -> None:
                while time.perf_counter() < stop:
                    t = time.perf_counter()
                    try:
                        r = await client.post(INFER, content=body, headers=headers)
                        code = str(r.status_code)
                    except httpx.HTTPError as e:
                        code = type(e).__name__
                    if code == "200":
                        latencies.append(time.perf_counter() - t)
                    codes[code] = codes.get(code, 0) + 1

            started = time.perf_counter()
            await asyncio.gather(*(one_client() for _ in range(clients)))
            return time.perf_counter() - started

    return measured(run, clients, latencies, codes)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds the process has used."""
    fields = stat_fields(pid)
    if fields is None:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def sweep(url: str, pid: int, drive: Callable[[int, float], dict[str, object]],
          clients: list[int], duration: float) -> list[dict[str, object]]:
    """One closed-loop phase per client count, with the server's CPU time per request."""
    drive(4, 1.0)  # warm-up: connections, allocator, the model's first batches
    points = []
    for n in clients:
        before = cpu_seconds(pid)
        point = drive(n, duration)
        answered = sum(point["codes"].values())  # type: ignore[union-attr]
        point["server_cpu_ms"] = round((cpu_seconds(pid) - before) * 1000 / max(answered, 1), 3)
        point["load_avg"] = round(os.getloadavg()[0], 2)
        points.append(point)
    return points


def best_within(points: list[dict[str, object]], budget_ms: float) -> dict[str, object] | None:
    """The point of most throughput whose p99 is within ``budget_ms`` (``None``: none is)."""
    within = [p for p in points if p["p99_ms"] <= budget_ms]  # type: ignore[operator]
    return max(within, key=lambda p: p["throughput_rps"]) if within else None  # type: ignore


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, help="a saved model (default: the Fashion-MNIST CNN)")
    p.add_argument("--clients", default="1,4,16,64",
                   help="client counts, comma-separated; the first is the low-load phase, the "
                        "last the saturation phase (default 1,4,16,64)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per client count")
    p.add_argument("--p99-budget-ms", type=float, default=50.0,
                   help="the p99 at which the two modes' throughputs are compared (default 50)")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--max-wait-ms", type=float, default=2.0)
    p.add_argument("--threads", type=int, help="the server's torch threads (default: its own)")
    p.add_argument("--binary", action="store_true",
                   help="tensors as raw bytes (binary extension) instead of JSON numbers")
    p.add_argument("--load-generator", choices=("lean", "httpx"), default="lean")
    args = p.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    threads = model_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or fashion_cnn(Path(tmp))
        _, info = load_model(model_dir)
        body, headers = request_body(torch.rand(1, *info.input_shape), args.binary)
        one = model_ms_per_input(model_dir, 1, threads)
        batched = model_ms_per_input(model_dir, args.max_batch_size, threads)
        result: dict[str, object] = {
            "benchmark": "serve_load", "model": info.arch, "cores": len(os.sched_getaffinity(0)),
            "load_avg_before": [round(x, 2) for x in os.getloadavg()],
            "tensors": "binary" if args.binary else "json", "load_generator": args.load_generator,
            # uvicorn parses HTTP with httptools where it is installed, else with h11.
            "http_parser": "httptools" if importlib.util.find_spec("httptools") else "h11",
            "server_threads": threads, "model_ms": round(one, 3),
            f"model_ms_per_input_at_{args.max_batch_size}": round(batched, 3),
            "batching_ceiling": round(one / batched, 2), "p99_budget_ms": args.p99_budget_ms}
        modes = {"batched": ["--max-batch-size", str(args.max_batch_size),
                             "--max-wait-ms", str(args.max_wait_ms)],
                 "unbatched": ["--max-batch-size", "1"]}
        for mode, flags in modes.items():
            proc, url = start_server(model_dir, [*flags, "--threads", str(threads)])
            drive: Callable[[int, float], dict[str, object]]
            if args.load_generator == "lean":
                drive = functools.partial(closed_loop, url, encode_post(url, INFER, body, headers))
            else:
                drive = functools.partial(httpx_closed_loop, url, body, headers)
            try:
                result[mode] = sweep(url, proc.pid, drive, clients, args.duration)
            finally:
                proc.terminate()
                proc.wait(30)
    b, u = result["batched"], result["unbatched"]
    b_best, u_best = best_within(b, args.p99_budget_ms), best_within(u, args.p99_budget_ms)
    result["at_budget"] = {"batched": b_best, "unbatched": u_best}
    result["ratio_at_budget"] = (round(b_best["throughput_rps"] / u_best["throughput_rps"], 2)
                                 if b_best and u_best else None)
    result["ratio_at_max_clients"] = round(b[-1]["throughput_rps"] / u[-1]["throughput_rps"], 2)
    result["low_p99_over_model"] = round(b[0]["p99_ms"] / one, 2)
    result["failed_at_max_clients"] = b[-1]["failed"] + u[-1]["failed"]
    result["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
