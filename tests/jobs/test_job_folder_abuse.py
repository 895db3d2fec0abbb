"""What a job can put in its own folder (issue 22), against a real server on loopback: links,
named pipes and sockets on every route that reads there, unbounded offsets, huge listings
(paged) and folder downloads (one streamed archive, resumable after a file)."""

from __future__ import annotations

import contextlib
import io
import os
import socket
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ringtrain.jobs.home import Home
from ringtrain.jobs.models.paging import DEFAULT_PAGE, MAX_PAGE
from ringtrain.jobs.service.api.auth import home_token
from tests.jobs.conftest import CLI, bearer, wait_for


@pytest.fixture(scope="module")
def http(served: tuple[Home, str]) -> Iterator[httpx.Client]:
    """A client of the module's server, which has `idle` (no nodes: its jobs never run)."""
    with httpx.Client(base_url=served[1], timeout=30, headers=bearer(served[0])) as client:
        assert client.post("/v1/clusters", json={"name": "idle", "nodes": 0}).status_code == 201
        yield client


def new_job(http: httpx.Client, served: tuple[Home, str]) -> tuple[str, Path]:
    """A queued job with the output `o` and a rank-0 log folder: its id and folder."""
    r = http.post("/v1/jobs", json={"cluster": "idle", "spec": {
        "name": "folder", "node_count": 1, "command": "true", "outputs": ["o"]}})
    assert r.status_code == 201, r.text
    folder = served[0].share_root / "jobs" / r.json()["id"]
    (folder / "stdouterr" / "rank.0").mkdir(parents=True)
    return r.json()["id"], folder


@pytest.fixture
def served_cli(served: tuple[Home, str], cli: CLI, monkeypatch: pytest.MonkeyPatch) -> CLI:
    """The CLI, talking to the module's server."""
    monkeypatch.setenv("RINGTRAIN_HOME", str(served[0].root))
    monkeypatch.delenv("RINGTRAIN_URL", raising=False)
    return cli


def special(path: Path, kind: str, secret: Path) -> socket.socket | None:
    """Make ``path`` a link to ``secret``, a named pipe or a listening Unix socket."""
    if kind == "link":
        path.symlink_to(secret)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.listen()
        return sock
    return None


@pytest.mark.parametrize("kind", ["link", "fifo", "socket"])
def test_no_route_follows_or_waits_on_what_a_job_put_in_its_folder(
        http: httpx.Client, served: tuple[Home, str], served_cli: CLI, tmp_path: Path,
        kind: str) -> None:
    secret = tmp_path / "shadow"
    secret.write_text("SECRET-HASH")
    job, folder = new_job(http, served)
    socks = [special(folder / "stdouterr" / "rank.0" / "stderr", kind, secret),
             special(folder / "outputs" / "o" / "bad", kind, secret)]
    (folder / "outputs" / "o" / "good").write_text("good")
    try:
        # 12 requests: more than the thread pool's workers, which a blocking open would all hold.
        for _ in range(12):
            r = http.get(f"/v1/jobs/{job}/logs", params={"stream": "stderr"}, timeout=5)
            assert r.status_code == 400 and "SECRET" not in r.text, r.text
            assert ("symbolic link" if kind == "link" else "not a regular file") in r.text
        r = http.get(f"/v1/jobs/{job}/download", params={"path": "outputs/o/bad"}, timeout=5)
        assert r.status_code == 400 and "SECRET" not in r.text
        listing = http.get(f"/v1/jobs/{job}/files", params={"path": "outputs"}, timeout=5)
        assert [f["path"] for f in listing.json()["files"]] == ["outputs/o/good"]
        r = http.get(f"/v1/jobs/{job}/archive", params={"path": "outputs"}, timeout=5)
        with tarfile.open(fileobj=io.BytesIO(r.content)) as tar:
            assert tar.getnames() == ["outputs/o/good"]
        rc, out, err = served_cli("job", "logs", job, "--stderr")
        assert rc == 2 and "SECRET" not in out + err
        # Another job's logs still answer: nothing is stuck.
        other, other_folder = new_job(http, served)
        (other_folder / "stdouterr" / "rank.0" / "stdout").write_text("fine\n")
        assert http.get(f"/v1/jobs/{other}/logs", timeout=5).text == "fine\n"
    finally:
        for sock in socks:
            if sock is not None:
                sock.close()


def test_a_log_made_a_link_while_followed_is_not_followed(http: httpx.Client,
                                                          served: tuple[Home, str],
                                                          tmp_path: Path) -> None:
    secret = tmp_path / "shadow"
    secret.write_text("SECRET-HASH")
    job, folder = new_job(http, served)
    log = folder / "stdouterr" / "rank.0" / "stdout"
    log.write_text("before\n")
    received = []
    with http.stream("GET", f"/v1/jobs/{job}/logs", params={"follow": True}) as r:
        assert r.status_code == 200
        chunks = r.iter_raw()
        received.append(next(chunks))
        log.unlink()
        log.symlink_to(secret)
        # The stream ends (the job is still queued): the next request says why.
        received.extend(chunks)
    assert b"".join(received) == b"before\n"
    r = http.get(f"/v1/jobs/{job}/logs")
    assert r.status_code == 400 and "symbolic link" in r.text


@pytest.mark.parametrize("offset,says", [
    ("99999999999999999999999", "offset must be between 0 and 9223372036854775807"),
    ("9223372036854775807", "past the end of 'stdouterr/rank.0/stdout', which holds 6 bytes"),
    ("7", "past the end"),
    ("-1", "offset must be between 0 and"),
])
def test_offsets_beyond_the_log_are_refused(http: httpx.Client, served: tuple[Home, str],
                                            offset: str, says: str) -> None:
    job, folder = new_job(http, served)
    (folder / "stdouterr" / "rank.0" / "stdout").write_text("hello\n")
    r = http.get(f"/v1/jobs/{job}/logs", params={"offset": offset})
    assert r.status_code == 400 and says in r.json()["detail"], r.text
    assert http.get(f"/v1/jobs/{job}/logs", params={"offset": 6}).text == ""
    assert http.get(f"/v1/jobs/{job}/logs", params={"offset": 2}).text == "llo\n"


@pytest.mark.parametrize("rank", ["-1", "1", "99999999999999999999999", "2147483648"])
def test_ranks_out_of_range_are_refused(http: httpx.Client, served: tuple[Home, str],
                                        rank: str) -> None:
    job, _ = new_job(http, served)
    r = http.get(f"/v1/jobs/{job}/logs", params={"rank": rank})
    assert r.status_code == 400 and "is out of range" in r.json()["detail"], r.text
    assert len(r.json()["detail"]) < 200


def many_files(folder: Path, count: int) -> list[str]:
    """``count`` files spread over nested folders and one flat folder; their paths, sorted."""
    paths = []
    for i in range(count):
        rel = f"outputs/o/d{i % 7}/f{i:05d}" if i % 3 else f"outputs/o/flat/{i:05d}.txt"
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(rel)
        paths.append(rel)
    return sorted(paths, key=lambda p: p.split("/"))


def test_listings_come_in_pages_that_resume_after_the_cursor(
        http: httpx.Client, served: tuple[Home, str], served_cli: CLI) -> None:
    job, folder = new_job(http, served)
    paths = many_files(folder, 2500)
    r = http.get(f"/v1/jobs/{job}/files", params={"path": "outputs"})
    first = r.json()
    assert len(first["files"]) == DEFAULT_PAGE and first["next_cursor"] == paths[DEFAULT_PAGE - 1]
    seen, params = [], {"path": "outputs", "limit": 700}
    while True:
        page = http.get(f"/v1/jobs/{job}/files", params=params).json()
        assert len(page["files"]) <= 700
        seen += [f["path"] for f in page["files"]]
        if page["next_cursor"] is None:
            break
        params["cursor"] = page["next_cursor"]
    assert seen == paths
    for limit in ("0", "-5", str(MAX_PAGE + 1), "99999999999999999999999"):
        r = http.get(f"/v1/jobs/{job}/files", params={"limit": limit})
        assert r.status_code == 400 and "limit must be between 1 and" in r.text, r.text
    for cursor in ("../x", "wd/a", "outputs"):
        r = http.get(f"/v1/jobs/{job}/files", params={"path": "outputs", "cursor": cursor})
        assert r.status_code == 400, r.text
    rc, out, _ = served_cli("job", "files", job, "outputs")
    listed = [line.split()[0] for line in out.splitlines()[1:]]
    assert rc == 0 and listed == paths


def test_a_folder_downloads_as_one_archive_that_resumes_after_a_file(
        http: httpx.Client, served: tuple[Home, str], served_cli: CLI, tmp_path: Path) -> None:
    job, folder = new_job(http, served)
    paths = many_files(folder, 300)
    (folder / "outputs" / "o" / "big.bin").write_bytes(os.urandom(3 << 20))
    paths = sorted([*paths, "outputs/o/big.bin"], key=lambda p: p.split("/"))
    (folder / "outputs" / "o" / "ln").symlink_to("/etc/passwd")
    requests = []
    served_http = httpx.Client.send

    def counting(self: httpx.Client, request: httpx.Request, **kw: object) -> httpx.Response:
        requests.append(request.url.path)
        return served_http(self, request, **kw)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(httpx.Client, "send", counting)
        rc, _, err = served_cli("job", "download", job, "outputs/o", "--to", str(tmp_path))
    assert rc == 0, err
    assert [p for p in requests if p != "/v1/health"] == [f"/v1/jobs/{job}/archive"]
    got = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert got == sorted(p.removeprefix("outputs/") for p in paths)
    assert (tmp_path / "o" / "big.bin").read_bytes() == \
        (folder / "outputs" / "o" / "big.bin").read_bytes()
    assert not (tmp_path / "o" / "ln").exists()

    # Resuming after a file gives exactly the files after it.
    r = http.get(f"/v1/jobs/{job}/archive", params={"path": "outputs", "after": paths[100]})
    with tarfile.open(fileobj=io.BytesIO(r.content)) as tar:
        assert tar.getnames() == paths[101:]


def test_a_download_cut_off_midway_resumes_where_it_stopped(
        http: httpx.Client, served: tuple[Home, str], tmp_path: Path) -> None:
    """The client's resume, driven through a proxy that drops the first connection midway."""
    from ringtrain.jobs.client.jobs_client import JobsClient

    home, url = served
    job, folder = new_job(http, served)
    paths = many_files(folder, 400)
    cut = {"done": False}

    class Cutting(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            response = super().handle_request(request)
            if request.url.path.endswith("/archive") and not cut["done"]:
                cut["done"] = True
                data = response.read()[:40_000]  # part of the archive, then the line drops

                def broken() -> Iterator[bytes]:
                    yield data
                    raise httpx.RemoteProtocolError("peer closed connection")
                return httpx.Response(200, stream=_Stream(broken()), request=request)
            return response

    client = JobsClient(url, home_token(home), reconnect_s=10)
    client._http._transport = Cutting()  # the fault injection
    written = client.download(job, "outputs", tmp_path)
    assert cut["done"]
    assert sorted(str(p.relative_to(tmp_path)) for p in written) == sorted(paths)
    for p in paths:
        assert (tmp_path / p).read_text() == p


class _Stream(httpx.SyncByteStream):
    def __init__(self, chunks: Iterator[bytes]):
        self._chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        yield from self._chunks


def test_health_answers_while_a_large_folder_is_listed(http: httpx.Client,
                                                       served: tuple[Home, str]) -> None:
    job, folder = new_job(http, served)
    many_files(folder, 3000)
    answer = threading.Event()  # set by each health answer
    done = threading.Event()

    def download() -> None:
        try:
            with http.stream("GET", f"/v1/jobs/{job}/archive", params={"path": "outputs"}) as r:
                for _ in r.iter_raw():  # a chunk, then a health answer, then the next chunk
                    if not answer.wait(30):
                        return  # no health answer while the archive was sent: answered stays
                    answer.clear()
        finally:
            done.set()

    t = threading.Thread(target=download)
    t.start()
    # Health answers while the folder is listed and sent; how fast (< 100 ms) is measured by
    # benchmarks/job_files_abuse.py.
    answered = 0
    with httpx.Client(base_url=str(http.base_url), headers=http.headers, timeout=30) as probe:
        while not done.is_set():
            assert probe.get("/v1/health").status_code == 200
            answered += 1
            answer.set()
    t.join()
    assert answered >= 2


@pytest.mark.parametrize("kind", ["link", "fifo", "socket"])
def test_status_files_a_job_replaced_are_refused_not_waited_on(tmp_path: Path, kind: str) -> None:
    """The scheduler reads each attempt's status file from the job's folder, under the service
    lock: a named pipe there would have stopped every job's supervision."""
    from ringtrain.jobs.errors import RecordError
    from ringtrain.jobs.files.record_file import read_record_file

    secret = tmp_path / "secret"
    secret.write_text("SECRET")
    status = tmp_path / "status.json"
    sock = special(status, kind, secret)
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            read_record_file(tmp_path, status.name, "the status file")
        except RecordError as e:
            outcome.append(e)

    try:
        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(20)
        if t.is_alive():
            with open(status, "w"):  # a writer lets the blocked open return
                pass
            pytest.fail("reading the status file blocked")
        assert outcome and "cannot read the status file" in str(outcome[0])
    finally:
        if sock is not None:
            sock.close()


def test_long_and_non_ascii_names_and_large_sizes_round_trip(tmp_path: Path) -> None:
    """ustar headers for the common case, pax past them; both read back by the client, and by
    tarfile (the archive is a standard one)."""
    from ringtrain.jobs.files.archive import tar_stream
    from ringtrain.jobs.files.extract import Extractor
    from ringtrain.jobs.service.share import Share

    share = Share(tmp_path / "share")
    out = tmp_path / "share" / "jobs" / "j1" / "outputs"
    names = ["short.txt", "é/ünïcode.bin", "/".join(["d" * 60] * 3) + "/long.txt", "x" * 200]
    for name in names:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(name.encode() * 3)
    chunks = list(tar_stream(share.iter_opened("j1", "outputs")))
    written = list(Extractor(tmp_path / "dl", "outputs").members(chunks))
    assert sorted(str(p.relative_to(tmp_path / "dl" / "outputs")) for p in written) == sorted(names)
    for name in names:
        assert (tmp_path / "dl" / "outputs" / name).read_bytes() == name.encode() * 3
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        assert sorted(tar.getnames()) == sorted(f"outputs/{n}" for n in names)


def test_a_followed_log_shorter_than_the_offset_is_read_from_its_start(
        http: httpx.Client, served: tuple[Home, str]) -> None:
    """A client resuming a followed log after a retry replaced it: the new log, whole."""
    job, folder = new_job(http, served)
    (folder / "stdouterr" / "rank.0" / "stdout").write_text("attempt 2\n")
    assert http.post(f"/v1/jobs/{job}/terminate").status_code == 200  # over: the stream ends
    r = http.get(f"/v1/jobs/{job}/logs", params={"follow": True, "offset": 5000})
    assert r.status_code == 200 and r.text == "attempt 2\n"
    r = http.get(f"/v1/jobs/{job}/logs", params={"offset": 5000})
    assert r.status_code == 400


def test_folder_downloads_beyond_the_limit_are_told_to_come_back(
        http: httpx.Client, served: tuple[Home, str]) -> None:
    from ringtrain.jobs.service.archive_process import MAX_PRODUCERS

    job, folder = new_job(http, served)
    (folder / "outputs" / "o").mkdir(parents=True, exist_ok=True)
    (folder / "outputs" / "o" / "big.bin").write_bytes(bytes(8 << 20))  # more than a pipe holds
    with contextlib.ExitStack() as open_streams:
        for _ in range(MAX_PRODUCERS):  # started, not read
            r = open_streams.enter_context(
                http.stream("GET", f"/v1/jobs/{job}/archive", params={"path": "outputs"}))
            assert r.status_code == 200
        busy = http.get(f"/v1/jobs/{job}/archive", params={"path": "outputs"})
        assert busy.status_code == 503, busy.text
        assert int(busy.headers["Retry-After"]) > 0 and "folder downloads" in busy.json()["detail"]
        assert http.get("/v1/health").status_code == 200
    # The clients left: their producers went with them, and the next download is served.
    r = wait_for(lambda: (got := http.get(f"/v1/jobs/{job}/archive",
                                          params={"path": "outputs"})).status_code == 200 and got,
                 timeout_s=30, every_s=0.1)
    with tarfile.open(fileobj=io.BytesIO(r.content)) as tar:
        assert tar.getnames() == ["outputs/o/big.bin"]
