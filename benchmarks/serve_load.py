"""Load test of `ringtrain serve`: N concurrent clients for T seconds, batching on and off.

Serves one model twice in a real server process (``ringtrain serve``), once with dynamic batching
and once with ``--max-batch-size 1``, and drives each with closed-loop clients on loopback (each
sends its next request when the last is answered): one client (low load), then N (saturation).
Prints one JSON line: per mode and phase the throughput, p50/p99 latency and the status counts
(failures are anything but 200 and 503), plus the model's own latency on one input measured in
this process.

    python benchmarks/serve_load.py [--model DIR] [--clients 32] [--duration 10] [--binary]

``--binary`` sends the input as raw bytes after the JSON (KServe v2's binary tensor data
extension) and asks for the output the same way, instead of numbers in JSON.

Without ``--model`` it serves the Fashion-MNIST CNN (random weights: the speed does not depend on
them). Goals (issue 12): batched throughput ≥ 3× unbatched at no worse p99; p99 at low load ≤ 2×
the model's own latency; zero failed requests at saturation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

from ringtrain.models.fashion_cnn import FashionCNN
from ringtrain.models.saved import ModelInfo, load_model, save_model


def fashion_cnn(directory: Path) -> Path:
    """The Fashion-MNIST CNN saved as training saves it."""
    save_model(directory, FashionCNN(), ModelInfo(
        arch="fashion_cnn", task="classification", classes=[str(i) for i in range(10)],
        input_shape=[1, 28, 28]))
    return directory


def model_latency_s(model_dir: Path, reps: int = 300) -> float:
    """Median seconds of one forward pass on one input, outside any server."""
    model, info = load_model(model_dir)
    x = torch.rand(1, *info.input_shape)
    with torch.inference_mode():
        for _ in range(20):
            model(x)
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - t)
    return statistics.median(times)


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


async def drive(url: str, body: bytes, headers: dict[str, str], clients: int,
                duration: float) -> dict[str, object]:
    """``clients`` closed-loop clients for ``duration`` seconds."""
    latencies: list[float] = []
    codes: dict[str, int] = {}
    stop = time.perf_counter() + duration
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        async def one_client() -> None:
            while time.perf_counter() < stop:
                t = time.perf_counter()
                try:
                    r = await client.post("/v2/models/model/infer", content=body,
                                          headers=headers)
                    code = str(r.status_code)
                except httpx.HTTPError as e:
                    code = type(e).__name__
                if code == "200":
                    latencies.append(time.perf_counter() - t)
                codes[code] = codes.get(code, 0) + 1

        started = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        elapsed = time.perf_counter() - started
    latencies.sort()

    def pct(p: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000, 2) \
            if latencies else float("nan")

    return {"clients": clients, "throughput_rps": round(len(latencies) / elapsed, 1),
            "p50_ms": pct(0.50), "p99_ms": pct(0.99), "codes": codes,
            "failed": sum(n for c, n in codes.items() if c not in ("200", "503"))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, help="a saved model (default: the Fashion-MNIST CNN)")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--duration", type=float, default=10.0, help="seconds per saturation phase")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--max-wait-ms", type=float, default=2.0)
    p.add_argument("--binary", action="store_true",
                   help="tensors as raw bytes (binary extension) instead of JSON numbers")
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or fashion_cnn(Path(tmp))
        _, info = load_model(model_dir)
        body, headers = request_body(torch.rand(1, *info.input_shape), args.binary)
        own_s = model_latency_s(model_dir)
        result: dict[str, object] = {"benchmark": "serve_load", "model": info.arch,
                                     "tensors": "binary" if args.binary else "json",
                                     "model_latency_ms": round(own_s * 1000, 3)}
        modes = {"batched": ["--max-batch-size", str(args.max_batch_size),
                             "--max-wait-ms", str(args.max_wait_ms)],
                 "unbatched": ["--max-batch-size", "1"]}
        for mode, flags in modes.items():
            proc, url = start_server(model_dir, flags)
            try:
                asyncio.run(drive(url, body, headers, 4, 1.0))  # warm-up
                result[mode] = {
                    "low": asyncio.run(drive(url, body, headers, 1, args.duration / 2)),
                    "saturated": asyncio.run(drive(url, body, headers, args.clients,
                                                   args.duration)),
                }
            finally:
                proc.terminate()
                proc.wait(30)
    b, u = result["batched"]["saturated"], result["unbatched"]["saturated"]  # type: ignore[index]
    result["throughput_ratio"] = round(b["throughput_rps"] / u["throughput_rps"], 2)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
