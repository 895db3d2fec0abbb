"""Authentication of the job service: a per-home token every route requires, sent by the CLI on
its own, and a Host header check against DNS rebinding. A real server on loopback."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import httpx
import pytest

from ringtrain.jobs.client.connection import read_server_file
from ringtrain.jobs.errors import RecordError
from ringtrain.jobs.home import Home
from ringtrain.jobs.service.api.auth import home_token

from .conftest import CLI


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_every_route_needs_the_token_and_the_cli_sends_it(home: Home, cli: CLI) -> None:
    rc, _, err = cli("cluster", "create", "c", "--nodes", "1")  # starts the server, no set-up
    assert rc == 0, err
    token = home.token_file.read_text().strip()
    assert _mode(home.token_file) == 0o600 and _mode(home.root) == 0o700
    info = read_server_file(home)
    assert info.token == token
    good = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=info.url, timeout=10) as http:
        for path in ("/v1/health", "/v1/clusters", "/v1/jobs", "/openapi.json", "/docs",
                     "/v1/no-such-route"):
            r = http.get(path)
            assert r.status_code == 401, path
            assert "Authorization: Bearer" in r.json()["detail"]
            assert http.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert http.get(path, headers={"Authorization": token}).status_code == 401
        assert http.post("/v1/jobs", json={}).status_code == 401
        assert http.get("/v1/clusters", headers=good).json()[0]["name"] == "c"
        # DNS rebinding: a page of evil.example resolved to 127.0.0.1 sends its own name.
        port = info.port
        for host in (f"evil.example:{port}", "127.0.0.1", f"127.0.0.1:{port + 1}",
                     f"localhost.evil.example:{port}"):
            r = http.get("/v1/clusters", headers={**good, "Host": host})
            assert r.status_code == 403, host
            assert "Host" in r.json()["detail"]
        for host in (f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}"):
            assert http.get("/v1/clusters", headers={**good, "Host": host}).status_code == 200


def test_the_bearer_scheme_is_case_insensitive(home: Home, cli: CLI) -> None:
    assert cli("cluster", "list")[0] == 0
    info = read_server_file(home)
    with httpx.Client(base_url=info.url, timeout=10) as http:
        for given, status in ((f"bearer {info.token}", 200), (f"BEARER {info.token}", 200),
                              (f"bearer {info.token.upper()}x", 401),
                              (f"Basic {info.token}", 401), (f"Bearer{info.token}", 401)):
            assert http.get("/v1/clusters", headers={"Authorization": given}
                            ).status_code == status, given


def test_the_token_survives_a_server_restart(home: Home, cli: CLI) -> None:
    assert cli("cluster", "list")[0] == 0
    first = home.token_file.read_text()
    assert cli("server", "stop")[0] == 0
    assert cli("cluster", "list")[0] == 0
    assert home.token_file.read_text() == first
    assert read_server_file(home).token == first.strip()


def test_token_created_once_under_concurrency(tmp_path: Path) -> None:
    home = Home(tmp_path / "h")
    tokens: list[str] = []
    threads = [threading.Thread(target=lambda: tokens.append(home_token(home)))
               for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(tokens) == 16 and len(set(tokens)) == 1 and len(tokens[0]) >= 32
    assert sorted(p.name for p in home.root.iterdir()) == ["share", "token"]


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    home = Home(tmp_path / "h")
    home_token(home)
    os.chmod(home.token_file, 0o644)
    with pytest.raises(RecordError, match="readable by other users.*delete it"):
        home_token(home)
    home.token_file.unlink()
    home.token_file.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RecordError, match="not a regular file"):
        home_token(home)
