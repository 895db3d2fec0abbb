"""`ringtrain serve --cert/--key`: the model server over HTTPS, with a real certificate and a client
that trusts exactly that certificate."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import httpx

from ringtrain.jobs.home import Home
from ringtrain.jobs.service.api.server_cert import home_certificate


def test_the_model_server_serves_https_with_the_given_certificate(tiny_classifier: Path,
                                                                   tmp_path: Path) -> None:
    cert = home_certificate(Home(tmp_path / "home"))  # a self-signed pair, as --tls makes it
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("RINGTRAIN_TOKEN", None)
    r = subprocess.run([sys.executable, "-m", "ringtrain.cli", "serve", str(tiny_classifier),
                        "--cert", str(cert.files.cert)], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 2 and "--cert and --key go together" in r.stderr, r.stderr
    proc = subprocess.Popen([sys.executable, "-m", "ringtrain.cli", "serve", str(tiny_classifier),
                             "--port", "0", "--name", "tiny", "--cert", str(cert.files.cert),
                             "--key", str(cert.files.key)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()  # bounded: the process exits on failure, closing stdout
        assert "serving" in line, proc.stderr.read() if proc.poll() is not None else line
        url = line.split(" at ")[1].split()[0]
        assert url.startswith("https://127.0.0.1:")
        trusted = ssl.create_default_context(cadata=cert.files.certificate_der())
        assert httpx.get(f"{url}/v2/models/tiny/ready", verify=trusted,
                         timeout=10).json() == {"ready": True}
        try:
            httpx.get(f"{url}/v2/models/tiny/ready", timeout=10)  # the system's CAs only
            raise AssertionError("a self-signed certificate passed the system's CAs")
        except httpx.ConnectError as e:
            assert "CERTIFICATE_VERIFY_FAILED" in str(e)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
