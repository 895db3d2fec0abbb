"""`ringtrain serve MODEL`: serve a trained model over HTTP (KServe v2 protocol, image route).

MODEL is a saved model's folder or weights file, or the id of a job that saved one in its outputs
(fetched through the job service, :mod:`ringtrain.serve.job_model`).

Exit codes: 2 bad input (a model that does not load or cannot be fetched, a bad flag, an address
that cannot be bound). SIGTERM or SIGINT stop it after the drain, and uvicorn then re-raises the
signal, so the status is the signal's (143 for SIGTERM in a shell).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from ringtrain.errors import RingtrainError
from ringtrain.serve.config import ServeConfig


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line; the only place the server reads environment variables."""
    d = ServeConfig()
    p = argparse.ArgumentParser(prog="ringtrain serve", description=__doc__.splitlines()[0])
    p.add_argument("model",
                   help="a saved model: its folder (model.pt or model.keras, + model.json), "
                        "its model.pt, a .keras file, its URL in object storage (az://, s3://, "
                        "gs://, https://), or the id of a job that saved one in its outputs")
    p.add_argument("--host", default=d.host, help=f"address to bind (default {d.host}; "
                   "anything else needs --token)")
    p.add_argument("--port", type=int, default=d.port, help=f"port (default {d.port}; 0: free)")
    p.add_argument("--token", default=os.environ.get("RINGTRAIN_TOKEN"),
                   help="bearer token clients must send (default: RINGTRAIN_TOKEN)")
    p.add_argument("--cert", help="serve HTTPS with this certificate (PEM; with --key)")
    p.add_argument("--key", help="the certificate's private key (PEM, no passphrase)")
    p.add_argument("--name", default=d.model_name,
                   help=f"the model's name in /v2/models/NAME (default {d.model_name})")
    p.add_argument("--device", default=d.device, help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--max-batch-size", type=int, default=d.max_batch_size,
                   help=f"most inputs per model call; 1 turns batching off "
                        f"(default {d.max_batch_size})")
    p.add_argument("--max-wait-ms", type=float, default=d.max_wait_ms,
                   help=f"how long a batch waits to fill (default {d.max_wait_ms:g})")
    p.add_argument("--queue-size", type=int, default=d.queue_size,
                   help=f"inputs waiting at most; beyond: 503 (default {d.queue_size})")
    p.add_argument("--timeout", type=float, default=d.timeout_s,
                   help=f"seconds a request may take: one forecast to take longer is refused at "
                        f"once with 503 and Retry-After (default {d.timeout_s:g})")
    p.add_argument("--max-body-mib", type=float, default=d.max_body_bytes / (1 << 20),
                   help="largest request body in MiB (default 16)")
    p.add_argument("--max-memory-mib", type=float, default=d.max_memory_bytes / (1 << 20),
                   help="memory the requests admitted may hold decoded; beyond it requests get "
                        f"503 before they are decoded (default {d.max_memory_bytes >> 20})")
    p.add_argument("--drain", type=float, default=d.drain_s,
                   help=f"seconds requests in flight get on stop (default {d.drain_s:g})")
    p.add_argument("--threads", type=int, default=d.threads,
                   help="torch threads for the model (default: the cores less one, at least 1)")
    p.add_argument("--ready-file", type=Path,
                   help="once listening, write {\"url\", \"pid\"} here as JSON (deployments "
                        "find their replicas this way)")
    p.add_argument("--jobs-url", default=os.environ.get("RINGTRAIN_URL"),
                   help="for a job id: the job service (default: RINGTRAIN_URL, else as the "
                        "job CLI finds it: the server of RINGTRAIN_HOME when set, the service "
                        "of `ringtrain login`, the server of ~/.ringtrain)")
    p.add_argument("--secret",
                   help="for a URL: the named secret (`ringtrain secret set`) holding the "
                        "store's credentials (default: the store library's own sources)")
    p.add_argument("--cache", type=Path,
                   help="for a URL: the cache folder (default: RINGTRAIN_CACHE, else "
                        "~/.cache/ringtrain)")
    return p.parse_args(argv)


def _announce(url: str, model: Path, name: str, ready_file: Path | None) -> None:
    print(f"serving {model} as {name!r} at {url} (docs: {url}/docs)", flush=True)
    if ready_file is not None:
        # Written whole, then renamed: a reader never sees half a file.
        tmp = ready_file.with_name(ready_file.name + ".tmp")
        tmp.write_text(json.dumps({"url": url, "pid": os.getpid()}))
        os.replace(tmp, ready_file)


def _model_path(args: argparse.Namespace, stack: ExitStack) -> Path:
    """The model's local path: MODEL itself, a stored model staged into the cache, or a job's
    model fetched into a temporary folder."""
    from ringtrain.jobs.models.ids import JOB_ID_PATTERN
    from ringtrain.storage.locations import is_url

    if is_url(args.model):
        from ringtrain.jobs.home import Home
        from ringtrain.serve.store_model import default_cache, fetch_store_model

        return fetch_store_model(args.model, args.secret, args.cache or default_cache(),
                                 Home.from_environ().secrets_folder)
    if Path(args.model).exists() or not re.fullmatch(JOB_ID_PATTERN, args.model):
        return Path(args.model)
    from ringtrain.serve.job_model import fetch_job_model

    dest = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ringtrain-model-")))
    # The job service's token is found as the job CLI finds it; --token is this server's own.
    path = fetch_job_model(str(args.model), dest, args.jobs_url)
    print(f"fetched the model of job {args.model} ({path.name})", flush=True)
    return path


def main(argv: list[str]) -> int:
    """Run ``ringtrain serve``."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request to the job service
    from ringtrain.serve.server import serve

    try:
        config = ServeConfig(
            host=args.host, port=args.port, token=args.token or None, model_name=args.name,
            device=args.device, max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms,
            queue_size=args.queue_size, timeout_s=args.timeout,
            max_body_bytes=int(args.max_body_mib * (1 << 20)),
            max_memory_bytes=int(args.max_memory_mib * (1 << 20)), drain_s=args.drain,
            threads=args.threads, cert_file=args.cert, key_file=args.key)
        with ExitStack() as stack:
            model = _model_path(args, stack)

            def ready(url: str) -> None:
                # The model is in memory by now: a fetched copy goes at once, since a stop
                # signal ends the process (uvicorn re-raises it) before any `finally` could.
                stack.close()
                _announce(url, model, config.model_name, args.ready_file)

            serve(model, config, on_ready=ready)
    except (RingtrainError, OSError) as e:
        print(f"ringtrain serve: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
