"""One home for the scripts and the CLI, and a command that starts a service says where it did.

A command run with another RINGTRAIN_HOME than the one holding the jobs starts a second, empty
service: it must say so, and name the homes whose service runs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ringtrain.jobs.client.connection import connect, stop_server
from ringtrain.jobs.client.known_homes import other_running_homes, registry_dir, remember
from ringtrain.jobs.errors import ServiceUnavailableError
from ringtrain.jobs.home import Home
from ringtrain.jobs.server_info import ServerInfo
from tests.jobs.conftest import CLI

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _server_file(home: Home, pid: int) -> None:
    home.ensure()
    ServerInfo(pid=pid, url="http://127.0.0.1:1", host="127.0.0.1", port=1, home=str(home.root),
               started_at=0.0).write(home.server_file)


def test_running_homes_are_those_whose_server_lives_and_deleted_ones_are_forgotten(
        tmp_path: Path, cache: Path) -> None:
    mine, alive, dead, gone = (Home(tmp_path / n) for n in ("mine", "alive", "dead", "gone"))
    _server_file(alive, os.getpid())
    _server_file(dead, 2**22 + 12345)  # above the kernel's largest pid: never alive
    mine.ensure()
    gone.root.mkdir()
    for home in (mine, alive, dead, gone):
        remember(home)
    remember(alive)  # twice: still one record
    gone.root.rmdir()
    assert other_running_homes(mine) == [alive.root]
    assert other_running_homes(alive) == []
    # the deleted home's record is gone; the others stay
    assert {p.read_text() for p in registry_dir().iterdir()} == {
        str(h.root) for h in (mine, alive, dead)}


def test_a_broken_record_or_registry_is_no_error(tmp_path: Path, cache: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    registry_dir().mkdir(parents=True)
    (registry_dir() / "junk").write_bytes(b"\xff\x00" * 3000)
    bad = Home(tmp_path / "bad")
    bad.ensure()
    bad.server_file.write_text("{not json")
    remember(bad)
    assert other_running_homes(Home(tmp_path / "x")) == []
    # a cache that cannot hold the registry (a file in its place): remember gives up quietly
    monkeypatch.setenv("XDG_CACHE_HOME", str(bad.server_file))
    remember(Home(tmp_path / "y"))
    assert other_running_homes(Home(tmp_path / "y")) == []


def test_a_command_in_an_empty_home_says_it_started_a_new_service_and_names_the_other(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, cli: CLI) -> None:
    first, second = Home(tmp_path / "first"), Home(tmp_path / "second")
    monkeypatch.delenv("RINGTRAIN_URL", raising=False)
    monkeypatch.delenv("RINGTRAIN_TOKEN", raising=False)
    try:
        monkeypatch.setenv("RINGTRAIN_HOME", str(first.root))
        rc, _, err = cli("cluster", "create", "local", "--nodes", "1", "--slots", "1")
        assert rc == 0 and f"started the job service for {first.root}" in err
        assert "a new home" in err and "other homes" not in err

        monkeypatch.setenv("RINGTRAIN_HOME", str(second.root))
        rc, out, err = cli("job", "list")
        assert rc == 0 and f"started the job service for {second.root}" in err
        assert "a new home: no clusters or jobs yet" in err
        assert f"Job services run for other homes: {first.root}" in err
        assert f"RINGTRAIN_HOME={first.root}" in err

        rc, _, err = cli("job", "list")  # the second home's service runs now: nothing to say
        assert rc == 0 and err == ""

        stop_server(second)
        third = Home(tmp_path / "third")
        with pytest.raises(ServiceUnavailableError) as raised:
            connect(home=third, autostart=False)
        assert f"no job server runs for {third.root}" in str(raised.value)
        assert str(first.root) in str(raised.value)
    finally:
        stop_server(first)
        stop_server(second)


def test_the_main_script_leaves_the_home_to_the_cli() -> None:
    script = (ROOT / "scripts" / "main.sh").read_text()
    assert "RINGTRAIN_HOME=" not in script
