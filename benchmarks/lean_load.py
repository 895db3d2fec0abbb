"""A lean HTTP/1.1 load generator: closed-loop clients on asyncio streams, for serve_load.py.

A load generator must cost much less per request than the server it measures, above all when
both share two cores. httpx spends about as much Python per request as the server does; this
client sends one request encoded once, over kept-alive connections, and reads an answer as the
status line, the headers up to ``Content-Length`` and that many bytes: 0.17-0.27 ms of CPU per
request on a contended 2-core VM, where httpx took 17 ms (``client_cpu_ms`` in the results says
what it took in each run).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import urlsplit


def encode_post(url: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """One ``POST`` request, head and body, as the bytes sent on a kept-alive connection."""
    host = urlsplit(url).netloc
    lines = [f"POST {path} HTTP/1.1", f"host: {host}", f"content-length: {len(body)}",
             *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """The status of one answer, read whole; and whether the server closes the connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length, closing = 0, False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"connection" and value.strip().lower() == b"close":
            closing = True
    await reader.readexactly(length)
    return status, closing


async def _one_client(url: str, request: bytes, stop: float, latencies: list[float],
                      codes: dict[str, int]) -> None:
    parts = urlsplit(url)
    writer = None
    try:
        while time.perf_counter() < stop:
            started = time.perf_counter()
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
                writer.write(request)
                status, closing = await asyncio.wait_for(_read_answer(reader), 30)
                code = str(status)
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as e:
                code, closing = type(e).__name__, True
            if code == "200":
                latencies.append(time.perf_counter() - started)
            codes[code] = codes.get(code, 0) + 1
            if closing:
                writer.close()
                writer = None
    finally:
        if writer is not None:
            writer.close()


def closed_loop(url: str, request: bytes, clients: int, duration: float) -> dict[str, object]:
    """``clients`` closed-loop clients (each sends its next request once the last is answered)
    for ``duration`` seconds.

    Args:
        url: The server, ``http://host:port``.
        request: What :func:`encode_post` made.
        clients: Concurrent connections.
        duration: Seconds.

    Returns:
        ``throughput_rps`` (answers 200 per second), ``p50_ms``/``p99_ms`` of those,
        ``codes`` (status or error name -> count), ``failed`` (anything but 200 and 503) and
        ``client_cpu_ms`` (this process's CPU per request).
    """
    latencies: list[float] = []
    codes: dict[str, int] = {}

    async def run() -> float:
        started = time.perf_counter()
        await asyncio.gather(*(_one_client(url, request, started + duration, latencies, codes)
                               for _ in range(clients)))
        return time.perf_counter() - started

    return measured(run, clients, latencies, codes)


def measured(run: Callable[[], Coroutine[Any, Any, float]], clients: int,
             latencies: list[float], codes: dict[str, int]) -> dict[str, object]:
    """Run a phase of closed-loop clients and summarise it (what :func:`closed_loop` returns).

    Args:
        run: The phase; fills ``latencies`` (seconds of each 200) and ``codes``, returns the
            seconds it took.
        clients: Its client count, for the summary.
        latencies: Filled by ``run``.
        codes: Filled by ``run``.
    """
    cpu = time.process_time()
    elapsed = asyncio.run(run())
    cpu = time.process_time() - cpu
    latencies.sort()

    def pct(p: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000, 2) \
            if latencies else float("nan")

    answered = sum(codes.values())
    return {"clients": clients, "throughput_rps": round(len(latencies) / elapsed, 1),
            "p50_ms": pct(0.50), "p99_ms": pct(0.99), "codes": codes,
            "failed": sum(n for c, n in codes.items() if c not in ("200", "503")),
            "client_cpu_ms": round(cpu * 1000 / max(answered, 1), 3)}
