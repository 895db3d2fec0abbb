"""A remote submit's upload against `tar c | nc`, on loopback, in one run (issue 38).

One folder of ``--files`` files holding ``--mb`` MB in all (random bytes: nothing compresses),
sent two ways, alternately, ``--repeats`` times each:

* upload: what ``ringtrain job submit --upload`` does before it submits: walk the folder by the
  working dir's ignore rules, describe the archive (:func:`~ringtrain.jobs.files.upload_tar.pack`)
  and stream it to a job server of a temporary home (``PUT /v1/uploads/{key}``, checked and
  written to disk as it arrives);
* tar: ``tar c -C DIR . > /dev/tcp/127.0.0.1/PORT`` (bash's socket; ``nc`` where there is no
  ``nc``) to a Python receiver writing to a file on the same disk.

Prints one JSON line: the medians in seconds, MB/s, and ``ratio`` = the upload's throughput over
tar's. Goal (issue 38): ratio ≥ 0.8 at 200 MB in 2,000 files.

    python benchmarks/upload.py [--mb 200] [--files 2000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

from ringtrain.jobs.client.connection import connect, stop_server
from ringtrain.jobs.files.upload_tar import pack
from ringtrain.jobs.home import Home


def make_folder(root: Path, mb: float, files: int) -> None:
    size = int(mb * 1e6 / files)
    for i in range(files):
        sub = root / f"d{i % 20:02d}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{i:05d}.bin").write_bytes(os.urandom(size))


def tar_to_socket(folder: Path, sink: Path) -> float:
    """Seconds for ``tar c`` of ``folder`` through a loopback socket into ``sink``."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]

    def receive() -> None:
        conn, _ = listener.accept()
        with conn, open(sink, "wb") as out:
            while data := conn.recv(1 << 20):
                out.write(data)

    thread = threading.Thread(target=receive)
    thread.start()
    start = time.perf_counter()
    subprocess.run(["bash", "-c", f'tar c -C "$1" . > /dev/tcp/127.0.0.1/{port}', "-",
                    str(folder)], check=True)
    thread.join()
    took = time.perf_counter() - start
    listener.close()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = root / "project"
        make_folder(folder, args.mb, args.files)
        home = Home(root / "home")
        os.environ.pop("RINGTRAIN_URL", None)
        client = connect(home=home)
        try:
            uploads, tars = [], []
            for _ in range(args.repeats):
                start = time.perf_counter()
                client.upload(uuid.uuid4().hex, pack(folder, {}))
                uploads.append(time.perf_counter() - start)
                tars.append(tar_to_socket(folder, root / "sink.tar"))
                for old in (home.share_root / "uploads").glob("*"):
                    subprocess.run(["rm", "-rf", str(old)], check=True)
        finally:
            client.close()
            stop_server(home)
    up, tar = statistics.median(uploads), statistics.median(tars)
    print(json.dumps({"benchmark": "upload", "mb": args.mb, "files": args.files,
                      "repeats": args.repeats, "upload_s": round(up, 3),
                      "tar_socket_s": round(tar, 3), "upload_MBps": round(args.mb / up, 1),
                      "tar_socket_MBps": round(args.mb / tar, 1), "ratio": round(tar / up, 3),
                      "goal": 0.8}))


if __name__ == "__main__":
    main()
