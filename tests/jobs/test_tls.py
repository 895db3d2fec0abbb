"""TLS of the job service on this host: `ringtrain server --tls` with its self-signed certificate
made once and reused, or a given one; clients that pin its fingerprint (the Python client, the CLI
through the environment or `ringtrain login`); a wrong or changed certificate refused naming both
fingerprints. Real servers, real TLS; the clients on other machines are in test_tls_network.py."""

from __future__ import annotations

import base64
import datetime
import hashlib
import io
import ipaddress
import json
import os
import select
import ssl
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ringtrain.jobs.cert_fingerprint import fingerprint_of, parse_fingerprint
from ringtrain.jobs.client import services
from ringtrain.jobs.client.jobs_client import JobsClient
from ringtrain.jobs.errors import CertificateError, InvalidRequestError
from ringtrain.jobs.home import Home
from ringtrain.jobs.models import ClusterSpec
from ringtrain.jobs.service.api.auth import home_token
from ringtrain.jobs.service.api.server_cert import home_certificate

from .conftest import CLI, wait_for
from .foreground_server import RunningServer, foreground_server
from .test_deploy import trained_job

OTHER = "SHA256:" + ":".join(["AB"] * 32)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _der(path: Path) -> bytes:
    """The first certificate of a PEM file (the server's own, before any CA's), as DER."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    return x509.load_pem_x509_certificate(path.read_bytes()).public_bytes(Encoding.DER)


@pytest.fixture(scope="module")
def restarted(tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[tuple[Home, RunningServer, RunningServer]]:
    """A home whose `server --tls` was started, stopped and started again; the second runs."""
    home = Home(tmp_path_factory.mktemp("tls") / "home")
    with foreground_server(home, "--tls", "--public-host", "trainer.example") as first:
        cert_before = (home.tls_folder / "cert.pem").read_bytes()
    with foreground_server(home, "--tls") as second:
        assert (home.tls_folder / "cert.pem").read_bytes() == cert_before
        yield home, first, second


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user of their own: config and home folders under ``tmp_path``, no service chosen by
    the environment (so `ringtrain login`'s current service is what commands use)."""
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "user" / ".config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user" / ".cache"))
    for name in ("RINGTRAIN_HOME", "RINGTRAIN_URL", "RINGTRAIN_TOKEN", "RINGTRAIN_TOKEN_FILE",
                 "RINGTRAIN_FINGERPRINT"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "user"


def test_the_self_signed_certificate_is_made_once_and_reused(restarted) -> None:
    home, first, second = restarted
    cert, key = home.tls_folder / "cert.pem", home.tls_folder / "key.pem"
    assert _mode(key) == 0o600 and _mode(home.tls_folder) == 0o700
    assert first.url.startswith("https://127.0.0.1:")
    # The same certificate after a restart, so that pinned clients keep working.
    assert first.fingerprint == second.fingerprint == fingerprint_of(_der(cert))
    # The form openssl prints, and what the server printed and `server status` shows.
    assert first.fingerprint == "SHA256:" + ":".join(
        f"{b:02X}" for b in hashlib.sha256(_der(cert)).digest())
    assert f"fingerprint {first.fingerprint}" in first.log()
    status = subprocess.run([sys.executable, "-m", "ringtrain.cli", "server", "status"],
                            env={**os.environ, "RINGTRAIN_HOME": str(home.root)},
                            capture_output=True, text=True, timeout=60)
    assert f"certificate fingerprint: {second.fingerprint}" in status.stdout, status
    from cryptography import x509

    names = x509.load_pem_x509_certificate(cert.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) == {"localhost", "trainer.example"}
    assert {str(a) for a in names.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}


def test_a_client_with_the_right_pin_works(restarted, tmp_path: Path, cli: CLI,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    home, _, server = restarted
    token = home_token(home)
    digest = hashlib.sha256(_der(home.tls_folder / "cert.pem")).digest()
    ssh_form = "SHA256:" + base64.b64encode(digest).decode().rstrip("=")
    for pin in (server.fingerprint, ssh_form, server.fingerprint[7:].lower().replace(":", "")):
        client = JobsClient(server.url, token, fingerprint=pin)
        assert client.health().home == str(home.root)
        client.close()
    client = JobsClient(server.url, token, fingerprint=ssh_form)
    client.create_cluster(ClusterSpec(name="pinned", nodes=1, slots=1))
    assert client.list_jobs() == []
    client.close()
    # A script: RINGTRAIN_URL with the token in a file and the pin.
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    monkeypatch.setenv("RINGTRAIN_URL", server.url)
    monkeypatch.setenv("RINGTRAIN_TOKEN_FILE", str(token_file))
    monkeypatch.setenv("RINGTRAIN_FINGERPRINT", server.fingerprint)
    rc, out, err = cli("cluster", "list", "-o", "json")
    assert rc == 0, err
    assert "pinned" in [c["name"] for c in json.loads(out)]
    rc, out, err = cli("job", "list", "-o", "json")
    assert (rc, json.loads(out)) == (0, []), err


def test_the_dashboard_cookie_is_sent_over_https_only(restarted) -> None:
    home, _, server = restarted
    r = httpx.get(f"{server.url}/dashboard", params={"token": home_token(home)},
                  verify=ssl.create_default_context(cafile=home.tls_folder / "cert.pem"),
                  timeout=30)
    assert r.status_code == 303, r.text
    assert "; Secure" in r.headers["set-cookie"] and "HttpOnly" in r.headers["set-cookie"]


def test_server_start_takes_the_flags_before_it(home: Home) -> None:
    env = {**os.environ, "RINGTRAIN_HOME": str(home.root)}

    def server(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ringtrain.cli", "server", *args], env=env,
                              capture_output=True, text=True, timeout=120)

    started = server("--tls", "--token", "a-token-kept-off-ps", "start", "-o", "json")
    try:
        assert started.returncode == 0, started.stderr
        info = json.loads(started.stdout)["server"]
        assert info["url"].startswith("https://127.0.0.1:") and info["fingerprint"], info
        pid = info["pid"]
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert b"--tls" in argv and b"a-token-kept-off-ps" not in b" ".join(argv), argv
        client = JobsClient(info["url"], "a-token-kept-off-ps", fingerprint=info["fingerprint"])
        assert client.health().home == str(home.root)
        client.close()
        again = server("--insecure", "start")  # another configuration: not silently ignored
        assert again.returncode == 1 and "server stop" in again.stderr, again
    finally:
        assert server("stop").returncode == 0


def test_a_wrong_pin_is_refused_naming_both_fingerprints(restarted, cli: CLI,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    home, _, server = restarted
    with pytest.raises(CertificateError) as refused:
        JobsClient(server.url, home_token(home), fingerprint=OTHER)
    message = str(refused.value)
    assert f"expected {OTHER}, got {server.fingerprint}" in message
    assert f"ringtrain login {server.url} --fingerprint {server.fingerprint}" in message
    monkeypatch.setenv("RINGTRAIN_URL", server.url)
    monkeypatch.setenv("RINGTRAIN_TOKEN", home_token(home))
    monkeypatch.setenv("RINGTRAIN_FINGERPRINT", OTHER)
    rc, _, err = cli("job", "list")
    assert rc == 1 and OTHER in err and server.fingerprint in err, err
    # Without a pin the certificate must be one a CA vouches for, and a self-signed one is not.
    monkeypatch.delenv("RINGTRAIN_FINGERPRINT")
    rc, _, err = cli("job", "list")
    assert rc == 1 and "no CA" in err and "--fingerprint" in err, err


@pytest.mark.fast
def test_a_peer_is_local_only_over_loopback_or_at_the_servers_own_address() -> None:
    from ringtrain.web.transport_guard import _from_this_host

    def scope(client: str, server: str = "10.0.0.5") -> dict:
        return {"client": (client, 40000), "server": (server, 8000)}

    for local in ("127.0.0.1", "127.3.2.1", "::1", "::ffff:127.0.0.1", "10.0.0.5"):
        assert _from_this_host(scope(local)), local
    for remote in ("10.0.0.6", "::ffff:10.0.0.6", "192.168.1.2", "fe80::1", "testclient"):
        assert not _from_this_host(scope(remote)), remote


@pytest.mark.fast
def test_fingerprints_are_read_in_both_forms_and_nothing_else() -> None:
    digest = bytes(range(32))
    canonical = fingerprint_of(b"x")
    assert parse_fingerprint(canonical) == canonical
    assert parse_fingerprint("sha256:" + canonical[7:].lower()) == canonical
    ssh = "SHA256:" + base64.b64encode(digest).decode().rstrip("=")
    assert parse_fingerprint(ssh) == "SHA256:" + ":".join(f"{b:02X}" for b in digest)
    for bad in ("", "SHA256:", "SHA256:AB:CD", canonical[:-1], "MD5:" + canonical[7:],
                canonical.replace(":", "::", 1), "SHA256:" + "!" * 43):
        with pytest.raises(InvalidRequestError, match="not a certificate fingerprint"):
            parse_fingerprint(bad)


def test_login_with_a_fingerprint_and_the_commands_that_follow(restarted, user: Path, cli: CLI,
                                                               tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    home, _, server = restarted
    token_file = tmp_path / "lab-token"
    token_file.write_text(home_token(home))
    token_file.chmod(0o600)
    rc, out, err = cli("login", server.url, "--name", "lab", "--fingerprint", server.fingerprint,
                       "--token-file", str(token_file))
    assert rc == 0, err
    assert f"logged in to lab at {server.url}" in out
    config = user / ".config" / "ringtrain"
    assert _mode(config) == 0o700 and _mode(config / "services.json") == 0o600
    assert home_token(home) not in (config / "services.json").read_text()  # a path, not a copy
    # Commands now use it: no RINGTRAIN_HOME, no --url.
    rc, _, err = cli("cluster", "create", "from-login", "--nodes", "1")
    assert rc == 0, err
    client = JobsClient(server.url, home_token(home), fingerprint=server.fingerprint)
    assert "from-login" in [c.name for c in client.list_clusters()]
    client.close()
    assert cli("job", "list")[0] == 0
    assert not (user / ".ringtrain").exists()  # no local service was started

    # The token on standard input: a private copy; the ssh form of the pin is accepted.
    monkeypatch.setattr(sys, "stdin", io.StringIO(home_token(home) + "\n"))
    digest = hashlib.sha256(_der(home.tls_folder / "cert.pem")).digest()
    rc, _, err = cli("login", server.url + "/", "--name", "lab2", "--fingerprint",
                     "SHA256:" + base64.b64encode(digest).decode().rstrip("="))
    assert rc == 0, err
    copy = config / "tokens" / "lab2"
    assert copy.read_text().strip() == home_token(home) and _mode(copy) == 0o600
    rc, out, _ = cli("login", "--list", "-o", "json")
    listed = json.loads(out)
    assert listed["current"] == "lab2" and set(listed["services"]) == {"lab", "lab2"}
    assert listed["services"]["lab2"]["fingerprint"] == server.fingerprint
    assert cli("login", "--use", "lab")[0] == 0
    assert services.current_service()[0] == "lab"
    assert cli("logout", "lab2")[0] == 0
    assert not copy.exists() and token_file.exists()  # the user's own file stays
    assert cli("logout", "nobody")[0] == 1

    # Not a terminal and no --fingerprint: refused, saying what it saw and what to pass.
    monkeypatch.setattr(sys, "stdin", io.StringIO(home_token(home)))
    rc, _, err = cli("login", server.url, "--name", "unasked")
    assert rc == 2 and server.fingerprint in err and "--fingerprint" in err, err
    # A wrong pin or a wrong token: refused, and nothing stored.
    rc, _, err = cli("login", server.url, "--name", "wrongpin", "--fingerprint", OTHER,
                     "--token-file", str(token_file))
    assert rc == 1 and OTHER in err and server.fingerprint in err, err
    monkeypatch.setattr(sys, "stdin", io.StringIO("not-the-token"))
    rc, _, err = cli("login", server.url, "--name", "wrongtoken", "--fingerprint",
                     server.fingerprint)
    assert rc == 1 and "refused the token" in err, err
    assert set(services.load().services) == {"lab"}
    assert not (config / "tokens" / "wrongtoken").exists()
    # `--use local` goes back to this host's own service; nothing is forgotten.
    assert cli("login", "--use", "local")[0] == 0
    assert services.current_service() is None and set(services.load().services) == {"lab"}


def test_login_in_a_terminal_shows_the_fingerprint_and_asks(restarted, user: Path,
                                                            tmp_path: Path) -> None:
    home, _, server = restarted
    token_file = tmp_path / "token"
    token_file.write_text(home_token(home))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGTRAIN_")}
    env.update(HOME=str(user), XDG_CONFIG_HOME=str(user / ".config"))

    def login(answer: str) -> tuple[int, str]:
        primary, secondary = os.openpty()
        proc = subprocess.Popen([sys.executable, "-m", "ringtrain.cli", "login", server.url,
                                 "--name", "asked", "--token-file", str(token_file)],
                                stdin=secondary, stdout=secondary, stderr=secondary, env=env)
        os.close(secondary)
        seen, answered = b"", False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the terminal closes with the command
            if select.select([primary], [], [], 0.2)[0]:
                try:
                    seen += os.read(primary, 4096)
                except OSError:  # the terminal closed: the command ended
                    break
                if b"[yes/no]" in seen and not answered:
                    os.write(primary, answer.encode() + b"\n")
                    answered = True
        proc.wait(timeout=60)
        os.close(primary)
        return proc.returncode, seen.decode(errors="replace")

    rc, shown = login("no")
    assert rc == 1 and server.fingerprint in shown.replace("\r\n", "\n"), shown
    assert "not logged in" in shown and "asked" not in services.load().services
    rc, shown = login("yes")
    assert rc == 0, shown
    assert services.load().services["asked"].fingerprint == server.fingerprint


def test_a_changed_certificate_is_refused_until_pinned_again(home: Home, user: Path, cli: CLI,
                                                             tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(home_token(home))
    with foreground_server(home, "--tls") as first:
        port = str(first.info.port)
        assert cli("login", first.url, "--name", "lab", "--fingerprint", first.fingerprint,
                   "--token-file", str(token_file))[0] == 0
        before = JobsClient(first.url, home_token(home), fingerprint=first.fingerprint)
        assert before.health()
    for name in ("cert.pem", "key.pem"):  # the owner makes a new certificate
        (home.tls_folder / name).unlink()
    with foreground_server(home, "--tls", "--port", port) as second:
        assert second.fingerprint != first.fingerprint and second.url == first.url
        rc, _, err = cli("cluster", "list")
        assert rc == 1, err
        assert f"expected {first.fingerprint}, got {second.fingerprint}" in err
        assert f"ringtrain login {first.url} --fingerprint {second.fingerprint}" in err
        # A client opened before the change: refused too, not taken for a lost connection.
        with pytest.raises(CertificateError, match=second.fingerprint):
            before.health()
        before.close()
        assert cli("login", first.url, "--name", "lab", "--fingerprint", second.fingerprint,
                   "--token-file", str(token_file))[0] == 0
        assert cli("cluster", "list")[0] == 0


def test_a_given_certificate_is_served_and_pinned(home: Home, tmp_path: Path, cli: CLI) -> None:
    cert, key = _ca_issued_pair(tmp_path)
    rc, _, err = cli("server", "--cert", str(cert))
    assert rc == 2 and "--cert and --key go together" in err
    rc, _, err = cli("server", "--cert", str(cert), "--key", str(tmp_path / "ca.key"))
    assert rc == 2 and "the key must be the certificate's" in err, err
    with foreground_server(home, "--cert", str(cert), "--key", str(key)) as server:
        assert server.fingerprint == fingerprint_of(_der(cert))
        assert not home.tls_folder.exists()
        client = JobsClient(server.url, home_token(home), fingerprint=server.fingerprint)
        assert client.health().pid == server.info.pid
        client.close()


def test_the_front_takes_a_certificate_and_its_key_together(home: Home, cli: CLI,
                                                           tmp_path: Path) -> None:
    cert, _ = _ca_issued_pair(tmp_path)
    rc, _, err = cli("deployment", "front", "model-serve-abc123", "--cert", str(cert))
    assert rc == 2 and "--cert and --key go together" in err, err
    assert not home.server_file.exists()  # refused before any service was asked


@pytest.mark.timeout(600)  # a job that saves a model, and a replica that imports torch
def test_the_front_of_a_deployment_serves_https(tmp_path: Path, cli: CLI,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    cert = home_certificate(Home(tmp_path / "certs"))  # a self-signed pair, as --tls makes it
    with trained_job(tmp_path, nodes=1) as (home, job_id):
        monkeypatch.setenv("RINGTRAIN_HOME", str(home.root))
        rc, out, err = cli("job", "deploy", job_id, "--wait", "300", "-o", "json")
        assert rc == 0, err
        deployment = json.loads(out)["id"]
        front = subprocess.Popen(
            [sys.executable, "-m", "ringtrain.cli", "deployment", "front", deployment,
             "--cert", str(cert.files.cert), "--key", str(cert.files.key)],
            env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        try:
            line = front.stdout.readline()  # bounded: the process exits on failure
            assert "front of deployment" in line, front.stderr.read() if front.poll() else line
            assert f"certificate {cert.fingerprint}" in line
            url = line.split(" at ")[1].split()[0]
            assert url.startswith("https://127.0.0.1:")
            trusted = ssl.create_default_context(cadata=cert.files.certificate_der())

            def ready() -> bool:
                try:  # the line comes before the front listens
                    return httpx.get(f"{url}/v2/health/ready", verify=trusted,
                                     timeout=10).status_code == 200
                except httpx.ConnectError as e:
                    assert "CERTIFICATE" not in str(e)
                    return False

            wait_for(ready, timeout_s=60)
        finally:
            front.terminate()
            front.wait(timeout=30)
        assert cli("deployment", "stop", deployment)[0] == 0


def test_binding_every_interface_needs_tls_or_insecure(home: Home, cli: CLI) -> None:
    rc, _, err = cli("server", "--host", "0.0.0.0", "--token", "secret-token",
                     "--public-host", "trainer.example")
    assert rc == 2
    assert "in the clear" in err and "--tls" in err and "--insecure" in err, err
    assert not home.server_file.exists()


def _ca_issued_pair(folder: Path) -> tuple[Path, Path]:
    """A CA and a server certificate it issued for 127.0.0.1 (PEM files: the server's
    certificate, the server's key), as an owner's own CA would make them."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def name(text: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("test CA")).issuer_name(name("test CA"))
          .public_key(ca_key.public_key()).serial_number(1)
          .not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder().subject_name(name("server")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(2)
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM

    def private(k: ec.EllipticCurvePrivateKey) -> bytes:
        return k.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption())

    (folder / "server.pem").write_bytes(leaf.public_bytes(pem) + ca.public_bytes(pem))
    (folder / "server.key").write_bytes(private(key))
    (folder / "ca.key").write_bytes(private(ca_key))
    return folder / "server.pem", folder / "server.key"
